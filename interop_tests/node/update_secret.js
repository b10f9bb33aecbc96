'use strict';
// connection.updateSecret with the connection's own password, then the connection is used
// as before: a queue is declared, a message published with a confirm and read back.
const { connect, run, uniqueName } = require('./common');

run(async (url) => {
  const secret = decodeURIComponent(new URL(url).password);
  const connection = await connect(url);
  const channel = await connection.createConfirmChannel();
  await connection.updateSecret(Buffer.from(secret), 'amqplib token refresh');

  const queue = uniqueName('amqplib-update-secret');
  await channel.assertQueue(queue, { exclusive: true });
  await new Promise((resolve, reject) =>
    channel.sendToQueue(queue, Buffer.from('after update'), {}, (err) => (err ? reject(err) : resolve())));
  const message = await channel.get(queue, { noAck: true });
  await channel.close();
  await connection.close();
  return { body: message && message.content.toString() };
});
