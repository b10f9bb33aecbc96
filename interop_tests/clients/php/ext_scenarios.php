<?php
// Scenarios of the php-amqp extension (Debian's php-amqp 1.11, AMQPConnection on rabbitmq-c)
// against a broker, for interop_tests/test_client_php.py.
//
//     php ext_scenarios.php <scenario> <amqp-url> [ca-file]
//
// Each scenario does what an application on the extension does and prints, as its last line,
// one JSON object: {"ok": true, ...what it observed...}, or {"ok": false, "error": "..."}. While
// it runs it may print {"event": ...} lines the test waits for. The test asserts on the JSON.

declare(strict_types=1);

function emit(array $object): void
{
    echo json_encode($object, JSON_UNESCAPED_SLASHES), "\n";
    flush();
}

function event(string $name): void
{
    emit(['event' => $name]);
}

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

function pattern(int $size): string
{
    // byte i is (i * 31 + 7) % 251, as in the other languages' scenarios; it repeats every 251 bytes.
    $cycle = '';
    for ($i = 0; $i < 251; $i++) {
        $cycle .= chr(($i * 31 + 7) % 251);
    }
    return substr(str_repeat($cycle, intdiv($size, 251) + 1), 0, $size);
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

/** confirmSelect, 20 publishes and a mandatory one nobody takes: its return comes before its ack. */
function scenario_confirms(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    $channel->confirmSelect();
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    $events = [];
    $acked = [];
    $channel->setConfirmCallback(
        function (int $tag, bool $multiple) use (&$events, &$acked) {
            for ($t = $multiple ? 1 : $tag; $t <= $tag; $t++) {
                $acked[$t] = true;
            }
            $events[] = "ack:$tag";
            return count($acked) < 21;  // false: waitForConfirm returns
        },
        function (int $tag, bool $multiple, bool $requeue) use (&$events) {
            $events[] = "nack:$tag";
            return false;
        }
    );
    $returned = null;
    $channel->setReturnCallback(function (int $code, string $text, string $exchange, string $routing_key, AMQPBasicProperties $properties, string $body) use (&$events, &$returned) {
        $events[] = 'return';
        $returned = ['code' => $code, 'text' => $text, 'body' => $body];
    });
    for ($i = 0; $i < 20; $i++) {
        $exchange->publish("message $i", $queue->getName(), AMQP_NOPARAM, ['content_type' => 'text/plain']);
    }
    $exchange->publish('unroutable', 'no-such-queue-anywhere', AMQP_MANDATORY);
    $channel->waitForConfirm(10.0);
    ksort($acked);
    $result = ['acked' => array_keys($acked), 'nacked' => count(array_filter($events, fn ($e) => str_starts_with($e, 'nack:'))),
               'returned' => $returned,
               'return_before_ack' => array_search('return', $events, true) < array_search('ack:21', $events, true),
               'message_count' => message_count($channel, $queue->getName())];
    $connection->disconnect();
    return $result;
}

/** setPrefetchCount(3) and a manual-ack consumer on 10 messages: three unacked at most. */
function scenario_prefetch(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    for ($i = 0; $i < 10; $i++) {
        $exchange->publish((string)$i, $queue->getName());
    }
    message_count($channel, $queue->getName());
    $channel->setPrefetchCount(3);
    $bodies = [];
    $held = [];
    $redelivered = 0;
    consume($queue, function (AMQPEnvelope $envelope) use (&$bodies, &$held, &$redelivered) {
        $bodies[] = $envelope->getBody();
        $held[] = $envelope->getDeliveryTag();
        $redelivered += $envelope->isRedelivery() ? 1 : 0;
        return count($bodies) < 3;
    });
    // A fourth delivery would break the limit: wait half a second for one.
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
        return count($bodies) < 10;
    }, AMQP_JUST_CONSUME);
    $result = ['held_before_ack' => $held_before_ack, 'bodies' => $bodies, 'redelivered' => $redelivered,
               'message_count' => message_count($channel, $queue->getName())];
    $connection->disconnect();
    return $result;
}

/** Prefetch 1: "first" rejected with requeue comes back redelivered and is acked; "second" is rejected for good. */
function scenario_reject(string $url): array
{
    $connection = connect($url);
    $channel = new AMQPChannel($connection);
    $channel->setPrefetchCount(1);
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    $exchange->publish('first', $queue->getName());
    $exchange->publish('second', $queue->getName());
    $deliveries = [];
    $rejected_first = false;
    consume($queue, function (AMQPEnvelope $envelope, AMQPQueue $queue) use (&$deliveries, &$rejected_first) {
        $tag = $envelope->getDeliveryTag();
        if ($envelope->getBody() === 'first' && !$rejected_first) {
            $queue->reject($tag, AMQP_REQUEUE);
            $rejected_first = true;
            $action = 'requeued';
        } elseif ($envelope->getBody() === 'first') {
            $queue->ack($tag);
            $action = 'acked';
        } else {
            $queue->reject($tag);
            $action = 'dropped';
        }
        $deliveries[] = ['body' => $envelope->getBody(), 'redelivered' => $envelope->isRedelivery(), 'action' => $action];
        return count($deliveries) < 3;
    });
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
function scenario_heartbeat(string $url): array
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

/** frame_max 4096: bodies of exactly one frame's payload, one byte more, and 1 MiB + 1. */
function scenario_large(string $url): array
{
    $connection = connect($url, ['frame_max' => 4096]);
    $channel = new AMQPChannel($connection);
    $queue = private_queue($channel);
    $exchange = default_exchange($channel);
    $sizes = [4096 - 8, 4096 - 7, (1 << 20) + 1];
    foreach ($sizes as $size) {
        $exchange->publish(pattern($size), $queue->getName());
    }
    $bodies = [];
    foreach ($sizes as $size) {
        $body = $queue->get(AMQP_AUTOACK)->getBody();
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

/** The memory alarm is set. The extension does not announce connection.blocked, so a confirmed
 * publish is just held: waitForConfirm times out until the test clears the alarm. */
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
    default_exchange($channel)->publish('held', $queue->getName());
    try {
        $channel->waitForConfirm(0.5);
        $while_alarmed = 'ack';
    } catch (AMQPQueueException $e) {  // "Wait timeout exceed"
        $while_alarmed = $e->getMessage();
    }
    event('held');
    if (!$acked) {
        $channel->waitForConfirm(20.0);
    }
    $envelope = $queue->get(AMQP_AUTOACK);
    $connection->disconnect();
    return ['while_alarmed' => $while_alarmed, 'acked' => $acked, 'body' => $envelope ? $envelope->getBody() : null];
}

/** A consumer on a durable queue holds a persistent message unacked when the broker restarts.
 * The extension has no automatic recovery: consume() throws, the application calls reconnect()
 * until it works, and opens its channel and queue again. */
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
    event('consuming');
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

[, $scenario, $url] = $argv + [null, null, null];
$ca_file = $argv[3] ?? null;
$scenarios = ['connect', 'confirms', 'prefetch', 'reject', 'channel_error', 'heartbeat', 'large', 'tls', 'blocked', 'restart'];
if (!in_array($scenario, $scenarios, true) || $url === null) {
    emit(['ok' => false, 'error' => 'usage: php ext_scenarios.php <' . implode('|', $scenarios) . '> <amqp-url> [ca-file]']);
    exit(1);
}
if (!extension_loaded('amqp')) {
    emit(['ok' => false, 'error' => 'the amqp extension is not loaded (Debian: php-amqp)']);
    exit(1);
}
try {
    $result = $scenario === 'tls' ? scenario_tls($url, $ca_file) : ("scenario_$scenario")($url);
} catch (\Throwable $e) {
    emit(['ok' => false, 'error' => get_class($e) . ': ' . $e->getMessage() . ' at line ' . $e->getLine()]);
    exit(1);
}
if (isset($result['error'])) {
    emit(['ok' => false] + $result);
    exit(1);
}
emit(['ok' => true] + $result);
