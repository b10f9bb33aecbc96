'use strict';
// A 1 MiB body through a connection with frame_max 4096 (about 256 body frames each way).
const crypto = require('crypto');
const { connect, collector, run } = require('./common');

const SIZE = 1024 * 1024;

run(async (url) => {
  const connection = await connect(url);
  const channel = await connection.createConfirmChannel();
  const { queue } = await channel.assertQueue('', { exclusive: true });
  const body = crypto.randomBytes(SIZE);
  const sentDigest = crypto.createHash('sha256').update(body).digest('hex');
  channel.sendToQueue(queue, body, { headers: { digest: sentDigest } });
  await channel.waitForConfirms();

  const got = collector(1, 10000, 'the large message');
  await channel.consume(queue, (msg) => {
    got.push(msg);
    channel.ack(msg);
  });
  const [msg] = await got.done;
  await channel.close();
  await connection.close();
  return {
    frameMax: connection.connection.frameMax,
    sentSize: SIZE,
    receivedSize: msg.content.length,
    sentDigest,
    receivedDigest: crypto.createHash('sha256').update(msg.content).digest('hex'),
    headerDigest: msg.properties.headers.digest,
  };
});
