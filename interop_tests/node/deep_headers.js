'use strict';
// Headers nested tables-and-arrays deep: at the broker's limit (64 levels, the headers table
// being level 1) amqplib publishes and decodes them; one level more closes the channel with 406.
const { connect, collector, run } = require('./common');

const LIMIT = 64;

// Tables and arrays in turn, `levels` deep counting the headers table, "leaf" innermost.
function nested(levels) {
  let value = { leaf: 'deep' };
  for (let level = 1; level < levels; level++) {
    value = (levels - level) % 2 === 0 ? [value] : { t: value };
  }
  return value;
}

function depth(headers) {
  let value = headers;
  let levels = 1;
  while (!(value && value.leaf !== undefined)) {
    value = Array.isArray(value) ? value[0] : value.t;
    levels += 1;
  }
  return { levels, leaf: value.leaf };
}

run(async (url) => {
  const connection = await connect(url);
  const channel = await connection.createConfirmChannel();
  const { queue } = await channel.assertQueue('', { exclusive: true });
  channel.sendToQueue(queue, Buffer.from('deep'), { headers: nested(LIMIT) });
  await channel.waitForConfirms();
  const got = collector(1, 10000, 'the deep message');
  await channel.consume(queue, (msg) => { got.push(msg); channel.ack(msg); });
  const [msg] = await got.done;
  await channel.close();

  const refused = await connection.createChannel();
  refused.on('error', () => {});
  const closed = new Promise((resolve) => refused.once('close', resolve));
  const errorSeen = new Promise((resolve) => refused.once('error', resolve));
  refused.sendToQueue(queue, Buffer.from('deeper'), { headers: nested(LIMIT + 1) });
  const error = await errorSeen;
  await closed;
  await connection.close();
  return { body: msg.content.toString(), ...depth(msg.properties.headers),
           refused: { code: error.code, message: error.message } };
});
