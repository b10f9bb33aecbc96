<?php
// Scenarios of the php-amqp extension (Debian's php-amqp 1.11, AMQPConnection on rabbitmq-c)
// against a broker, for interop_tests/test_client_php.py.
//
//     php ext_scenarios.php <scenario> <amqp-url> [ca-file]
//
// Each scenario does what an application on the extension does; scenario_common.php says how the
// script is run and what it prints. The test asserts on the JSON.

declare(strict_types=1);

require_once __DIR__ . '/scenario_common.php';

/** AMQPConnection's credentials from the URL (it takes no URL itself). */
function credentials(string $url, array $extra = []): array
{
    $parts = parse_url($url);
    return $extra + [
        'host' => $parts['host'],
        'port' => $parts['port'] ?? ($parts['scheme'] === 'amqps' ? 5671 : 5672),
        'login' => urldecode($parts['user'] ?? 'guest'),
        'password' => urldecode($parts['pass'] ?? 'guest'),
        'vhost' => isset($parts['path']) && strlen($parts['path']) > 1 ? urldecode(substr($parts['path'], 1)) : '/',
        'read_timeout' => 5.0,
    ];
}

function connect(string $url, array $extra = []): AMQPConnection
{
    $connection = new AMQPConnection(credentials($url, $extra));
    $connection->connect();
    return $connection;
}

/** An exclusive server-named queue. */
function private_queue(AMQPChannel $channel): AMQPQueue
{
    $queue = new AMQPQueue($channel);
    $queue->setFlags(AMQP_EXCLUSIVE | AMQP_AUTODELETE);
    $queue->declareQueue();
    return $queue;
}

function message_count(AMQPChannel $channel, string $name): int
{
    $queue = new AMQPQueue($channel);
    $queue->setName($name);
    $queue->setFlags(AMQP_PASSIVE);
    return $queue->declareQueue();
}

function default_exchange(AMQPChannel $channel): AMQPExchange
{
    return new AMQPExchange($channel);  // no name: the default exchange
}

/** Consume until $callback returns false, or fail after the connection's read_timeout. */
function consume(AMQPQueue $queue, callable $callback, int $flags = AMQP_NOPARAM): void
{
    $queue->consume(fn (AMQPEnvelope $envelope, AMQPQueue $q) => $callback($envelope, $q), $flags);
}

// ---- scenarios ---------------------------------------------------------------------------

function scenario_connect(string $url): array
{
    $connection = connect($url);
    $result = ['channel_max' => $connection->getMaxChannels(), 'frame_max' => $connection->getMaxFrameSize(),
               'heartbeat' => $connection->getHeartbeatInterval(), 'connected' => $connection->isConnected()];
    $connection->disconnect();
    return $result;
}

/** confirmSelect, 100 publishes and a mandatory one nobody takes: its return comes before its ack. */
function scenario_confirms(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    $channel->confirmSelect();
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    $events = [];
    $settled = [];  // tag => 'ack' or 'nack'
    $settle = function (string $outcome, int $tag, bool $multiple) use (&$events, &$settled) {
        for ($t = $multiple ? 1 : $tag; $t <= $tag; $t++) {
            $settled[$t] = $settled[$t] ?? $outcome;
        }
        $events[] = "$outcome:$tag";
        return count($settled) < 101;  // false: waitForConfirm returns
    };
    $channel->setConfirmCallback(
        fn (int $tag, bool $multiple) => $settle('ack', $tag, $multiple),
        fn (int $tag, bool $multiple, bool $requeue) => $settle('nack', $tag, $multiple)
    );
    $returned = null;
    $channel->setReturnCallback(function (int $code, string $text, string $exchange, string $routing_key, AMQPBasicProperties $properties, string $body) use (&$events, &$returned) {
        $events[] = 'return';
        $returned = ['code' => $code, 'text' => $text, 'body' => $body];
    });
    for ($i = 0; $i < 100; $i++) {
        $exchange->publish("message $i", $queue->getName(), AMQP_NOPARAM, ['content_type' => 'text/plain']);
    }
    $exchange->publish('unroutable', 'no-such-queue-anywhere', AMQP_MANDATORY);
    $channel->waitForConfirm(10.0);
    ksort($settled);
    $result = ['acked' => array_keys($settled, 'ack', true), 'nacked' => array_keys($settled, 'nack', true),
               'returned' => $returned,
               'return_before_ack' => array_search('return', $events, true) < array_search('ack:101', $events, true),
               'message_count' => message_count($channel, $queue->getName())];
    $connection->disconnect();
    return $result;
}

/** setPrefetchCount(10) and a manual-ack consumer on 50 messages: ten unacked at most. */
function scenario_prefetch(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    for ($i = 0; $i < 50; $i++) {
        $exchange->publish((string)$i, $queue->getName());
    }
    message_count($channel, $queue->getName());
    $channel->setPrefetchCount(10);
    $bodies = [];
    $held = [];
    $redelivered = 0;
    consume($queue, function (AMQPEnvelope $envelope) use (&$bodies, &$held, &$redelivered) {
        $bodies[] = $envelope->getBody();
        $held[] = $envelope->getDeliveryTag();
        $redelivered += $envelope->isRedelivery() ? 1 : 0;
        return count($bodies) < 10;
    });
    // An eleventh delivery would break the limit: wait half a second for one.
    $connection->setReadTimeout(0.5);
    try {
        consume($queue, function (AMQPEnvelope $envelope) use (&$bodies) {
            $bodies[] = $envelope->getBody();
            return false;
        }, AMQP_JUST_CONSUME);
    } catch (AMQPQueueException $e) {  // "Consumer timeout exceed"
    }
    $held_before_ack = count($bodies);
    $connection->setReadTimeout(5.0);
    foreach ($held as $tag) {
        $queue->ack($tag);
    }
    consume($queue, function (AMQPEnvelope $envelope, AMQPQueue $queue) use (&$bodies, &$redelivered) {
        $bodies[] = $envelope->getBody();
        $redelivered += $envelope->isRedelivery() ? 1 : 0;
        $queue->ack($envelope->getDeliveryTag());
        return count($bodies) < 50;
    }, AMQP_JUST_CONSUME);
    $result = ['held_before_ack' => $held_before_ack, 'bodies' => $bodies, 'redelivered' => $redelivered,
               'message_count' => message_count($channel, $queue->getName())];
    $connection->disconnect();
    return $result;
}

/** "0", "1", "2" and a consumer with prefetch 1: "0" rejected with requeue comes back first and is
 * acked, "1" is acked, "2" is rejected for good; then 200 ms for anything more (a fifth delivery). */
function scenario_reject_requeue(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    $channel->setPrefetchCount(1);
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    foreach (['0', '1', '2'] as $body) {
        $exchange->publish($body, $queue->getName());
    }
    $deliveries = [];
    $take = function (AMQPEnvelope $envelope, AMQPQueue $queue) use (&$deliveries) {
        $deliveries[] = ['body' => $envelope->getBody(), 'redelivered' => $envelope->isRedelivery()];
        $tag = $envelope->getDeliveryTag();
        if ($envelope->getBody() === '0' && !$envelope->isRedelivery()) {
            $queue->reject($tag, AMQP_REQUEUE);
        } elseif ($envelope->getBody() === '2') {
            $queue->reject($tag);
        } else {
            $queue->ack($tag);
        }
        return count($deliveries) < 4;
    };
    consume($queue, $take);
    $connection->setReadTimeout(0.2);
    try {
        consume($queue, $take, AMQP_JUST_CONSUME);
    } catch (AMQPQueueException $e) {  // "Consumer timeout exceed": nothing more, as it should be
    }
    $connection->setReadTimeout(5.0);
    $result = ['deliveries' => $deliveries, 'message_count' => message_count($channel, $queue->getName())];
    $connection->disconnect();
    return $result;
}

/** A passive declare of a missing queue, and an ack of an unknown tag: each ends its channel; a new
 * AMQPChannel on the same connection carries on. */
function scenario_channel_error(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    try {
        message_count($channel, 'no-such-queue-php-ext');
        return ['error' => 'the passive declare of a missing queue succeeded'];
    } catch (AMQPQueueException $e) {
        $missing = ['code' => $e->getCode(), 'message' => $e->getMessage(), 'channel_open' => $channel->isConnected()];
    }
    $channel = new AMQPChannel($connection);
    $queue = private_queue($channel);
    $queue->ack(99);
    try {
        message_count($channel, $queue->getName());
        return ['error' => 'no channel error after an ack of an unknown tag'];
    } catch (AMQPQueueException $e) {
        $unknown_tag = ['code' => $e->getCode(), 'message' => $e->getMessage(), 'channel_open' => $channel->isConnected()];
    }
    // The exclusive queue belongs to the connection and outlives its channel.
    $channel = new AMQPChannel($connection);
    $again = new AMQPQueue($channel);
    $again->setName($queue->getName());
    default_exchange($channel)->publish('still here', $queue->getName());
    $envelope = $again->get(AMQP_AUTOACK);
    $result = ['missing_queue' => $missing, 'unknown_tag' => $unknown_tag,
               'after' => $envelope ? $envelope->getBody() : null, 'connection_open' => $connection->isConnected()];
    $connection->disconnect();
    return $result;
}

/** heartbeat 1 s, then 3 s in consume() with nothing to deliver: "Consumer timeout exceed", and the connection works. */
function scenario_heartbeats(string $url): array
{
    $connection = connect($url, ['heartbeat' => 1, 'read_timeout' => 3.0]);
    $channel = new AMQPChannel($connection);
    $queue = private_queue($channel);
    try {
        consume($queue, fn () => false, AMQP_AUTOACK);
        $idle = 'a delivery';
    } catch (AMQPQueueException $e) {
        $idle = $e->getMessage();
    } catch (\Throwable $e) {
        return ['heartbeat' => $connection->getHeartbeatInterval(), 'idle' => get_class($e) . ': ' . $e->getMessage(), 'after' => null];
    }
    default_exchange($channel)->publish('after the idle time', $queue->getName());
    $after = null;
    consume($queue, function (AMQPEnvelope $envelope) use (&$after) {
        $after = $envelope->getBody();
        return false;
    }, AMQP_JUST_CONSUME);
    $result = ['heartbeat' => $connection->getHeartbeatInterval(), 'idle' => $idle, 'after' => $after];
    $connection->disconnect();
    return $result;
}

/** frame_max 4096: bodies around one and two frames' payload, and up to 1 MiB + 1
 * (client_expectations.large_message_sizes), each published and got back intact. */
function scenario_large_message(string $url): array
{
    $connection = connect($url, ['frame_max' => 4096]);
    $channel = new AMQPChannel($connection);
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    $payload = $connection->getMaxFrameSize() - 8;
    $sizes = [0, 1, $payload - 1, $payload, $payload + 1, 2 * $payload, 2 * $payload + 1, 100000, 1 << 20, (1 << 20) + 1];
    foreach ($sizes as $size) {
        $exchange->publish(pattern($size), $queue->getName());
    }
    $bodies = [];
    foreach ($sizes as $size) {
        $envelope = $queue->get(AMQP_AUTOACK);
        if ($envelope === false) {
            return ['error' => "no message of $size bytes in the queue"];
        }
        $body = $envelope->getBody();
        $body = $body === false ? '' : $body;  // the extension's getBody() is false for an empty body
        $bodies[] = ['size' => strlen($body), 'intact' => $body === pattern($size)];
    }
    $result = ['frame_max' => $connection->getMaxFrameSize(), 'bodies' => $bodies];
    $connection->disconnect();
    return $result;
}

/** The test CA as cacert, verify on (peer and host name): a message there and back. */
function scenario_tls(string $url, string $ca_file): array
{
    $connection = connect($url, ['cacert' => $ca_file, 'verify' => true]);
    $channel = new AMQPChannel($connection);
    $queue = private_queue($channel);
    default_exchange($channel)->publish('over tls', $queue->getName());
    $envelope = $queue->get(AMQP_AUTOACK);
    $connection->disconnect();
    return ['body' => $envelope ? $envelope->getBody() : null];
}

/** A confirmed publish through a memory alarm, which the test raises at "ready" and clears at
 * "blocked". The extension does not announce connection.blocked, so the publish is just held:
 * waitForConfirm times out until the alarm is cleared. */
function scenario_blocked(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    $channel->confirmSelect();
    $acked = false;
    $channel->setConfirmCallback(function () use (&$acked) {
        $acked = true;
        return false;  // waitForConfirm returns
    }, fn () => false);
    $queue = private_queue($channel);
    event('ready');
    default_exchange($channel)->publish('held', $queue->getName());
    try {
        $channel->waitForConfirm(0.5);
        $while_alarmed = 'ack';
    } catch (AMQPQueueException $e) {  // "Wait timeout exceed"
        $while_alarmed = $e->getMessage();
    }
    event('blocked');
    if (!$acked) {
        $channel->waitForConfirm(20.0);
    }
    $envelope = $queue->get(AMQP_AUTOACK);
    $connection->disconnect();
    return ['while_alarmed' => $while_alarmed, 'acked' => $acked, 'body' => $envelope ? $envelope->getBody() : null];
}

/** A consumer on a durable queue holds a persistent message unacked when, at "ready",
 * the test restarts the broker. The extension has no automatic recovery: consume() throws, the
 * application calls reconnect() until it works, and opens its channel and queue again. */
function scenario_restart(string $url): array
{
    $name = 'php-amqp-restart-' . getmypid();
    $connection = connect($url, ['read_timeout' => 20.0]);
    $channel = new AMQPChannel($connection);
    $queue = new AMQPQueue($channel);
    $queue->setName($name);
    $queue->setFlags(AMQP_DURABLE);
    $queue->declareQueue();
    $channel->startTransaction();  // the commit returns once the message is stored
    default_exchange($channel)->publish('in flight', $name, AMQP_NOPARAM, ['delivery_mode' => AMQP_DURABLE]);
    $channel->commitTransaction();
    $first = null;
    consume($queue, function (AMQPEnvelope $envelope) use (&$first) {
        $first = $envelope->getBody();
        return false;
    });
    event('ready');
    try {
        consume($queue, fn () => false, AMQP_JUST_CONSUME);
        return ['error' => 'the broker restarted and nothing was noticed'];
    } catch (AMQPException $e) {
        $closed = ['class' => get_class($e), 'code' => $e->getCode(), 'message' => $e->getMessage()];
    }
    $attempts = 0;
    while (true) {
        $attempts++;
        try {
            if ($connection->reconnect()) {
                break;
            }
        } catch (AMQPConnectionException $e) {
        }
        if ($attempts > 150) {
            return ['error' => 'no connection within 30 s of the restart'];
        }
        usleep(200000);
    }
    $channel = new AMQPChannel($connection);
    $queue = new AMQPQueue($channel);
    $queue->setName($name);
    $queue->setFlags(AMQP_DURABLE);
    $queue->declareQueue();
    $deliveries = [];
    $published = false;
    consume($queue, function (AMQPEnvelope $envelope, AMQPQueue $queue) use (&$deliveries, &$published, $channel, $name) {
        $deliveries[] = ['body' => $envelope->getBody(), 'redelivered' => $envelope->isRedelivery()];
        $queue->ack($envelope->getDeliveryTag());
        if (!$published) {
            default_exchange($channel)->publish('after the restart', $name);
            $published = true;
        }
        return count($deliveries) < 2;
    });
    $queue->delete();
    $connection->disconnect();
    return ['closed' => $closed, 'reconnected' => true, 'deliveries' => $deliveries];
}

if (!extension_loaded('amqp')) {
    emit(['ok' => false, 'error' => 'the amqp extension is not loaded (Debian: php-amqp)']);
    exit(1);
}
run_scenario($argv);
