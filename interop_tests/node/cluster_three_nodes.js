'use strict';
// Three cluster nodes (URLs joined by "|"): declare a queue on the first, publish with confirms
// on the second, consume on the third with prefetch 3, nack with requeue once, then ack all.
const { connect, collector, run } = require('./common');

const COUNT = 20;

run(async (urls) => {
  const [urlA, urlB, urlC] = urls.split('|');
  const a = await connect(urlA);
  const declaring = await a.createChannel();
  const queue = `amqplib-any-node-${process.pid}`;
  await declaring.assertQueue(queue, { durable: true });

  const b = await connect(urlB);
  const publishing = await b.createConfirmChannel();
  // The queue reaches every node's definitions a moment after declare-ok: wait until b knows it.
  for (let attempt = 0; ; attempt++) {
    const probe = await b.createChannel();
    probe.on('error', () => {});
    try {
      await probe.checkQueue(queue);
      await probe.close();
      break;
    } catch (err) {
      if (attempt > 100) throw err;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  const confirmed = [];
  for (let i = 0; i < COUNT; i++) {
    publishing.sendToQueue(queue, Buffer.from(`m${i}`), { persistent: true }, (err) => {
      confirmed.push(err ? `nack:${i}` : i);
    });
  }
  await publishing.waitForConfirms();

  const c = await connect(urlC);
  const consuming = await c.createChannel();
  await consuming.prefetch(3);
  const received = collector(COUNT + 1, 15000, 'deliveries');
  let held = 0;
  let maxHeld = 0;
  let nacked = false;
  const { consumerTag } = await consuming.consume(queue, (msg) => {
    if (msg === null) return; // cancelled by the broker
    received.push({ body: msg.content.toString(), redelivered: msg.fields.redelivered, tag: msg.fields.deliveryTag });
    held += 1;
    maxHeld = Math.max(maxHeld, held);
    setTimeout(() => {
      held -= 1;
      if (!nacked && msg.content.toString() === 'm5') {
        nacked = true;
        consuming.nack(msg, false, true);
      } else {
        consuming.ack(msg);
      }
    }, 10);
  });
  const deliveries = await received.done;
  await new Promise((resolve) => setTimeout(resolve, 100));
  await consuming.cancel(consumerTag);
  const check = await declaring.checkQueue(queue);
  await declaring.deleteQueue(queue);
  await Promise.all([a.close(), b.close(), c.close()]);
  return { confirmed, deliveries, maxHeld, remainingOnOwner: check.messageCount };
});
