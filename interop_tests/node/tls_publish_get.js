'use strict';
// Over AMQPS: trust the test CA in AMQPS_CA; with AMQPS_CLIENT_PEM present a client
// certificate, and with AMQPS_EXTERNAL=1 log in with SASL EXTERNAL (the certificate's CN).
// Publish one message to a fresh queue and get it back.
const fs = require('fs');
const amqp = require('amqplib');
const { run } = require('./common');

run(async (url) => {
  const socketOptions = { ca: [fs.readFileSync(process.env.AMQPS_CA)], servername: 'localhost' };
  if (process.env.AMQPS_CLIENT_PEM) {
    const pem = fs.readFileSync(process.env.AMQPS_CLIENT_PEM);
    socketOptions.cert = pem;
    socketOptions.key = pem;
  }
  if (process.env.AMQPS_EXTERNAL === '1') {
    socketOptions.credentials = amqp.credentials.external();
  }
  const connection = await amqp.connect(url, socketOptions);
  connection.on('error', () => {});
  const channel = await connection.createChannel();
  const { queue } = await channel.assertQueue('', { exclusive: true });
  channel.sendToQueue(queue, Buffer.from('over tls'));
  let message = false;
  for (let i = 0; i < 50 && !message; i++) {
    message = await channel.get(queue, { noAck: true });
    if (!message) await new Promise((r) => setTimeout(r, 20));
  }
  await channel.close();
  await connection.close();
  return { body: message ? message.content.toString() : null };
});
