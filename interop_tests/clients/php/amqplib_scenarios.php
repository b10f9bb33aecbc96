<?php
// Scenarios of php-amqplib (Debian's php-amqplib 3.5) against a broker, for
// interop_tests/test_client_php.py.
//
//     php amqplib_scenarios.php <scenario> <amqp-url> [ca-file]
//
// Each scenario does what an application on php-amqplib does; scenario_common.php says how the
// script is run and what it prints. The test asserts on the JSON.

declare(strict_types=1);

require_once __DIR__ . '/scenario_common.php';

require_once '/usr/share/php/PhpAmqpLib/autoload.php';

use PhpAmqpLib\Channel\AbstractChannel;
use PhpAmqpLib\Channel\AMQPChannel;
use PhpAmqpLib\Connection\AbstractConnection;
use PhpAmqpLib\Connection\AMQPSSLConnection;
use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Exception\AMQPConnectionClosedException;
use PhpAmqpLib\Exception\AMQPProtocolChannelException;
use PhpAmqpLib\Exception\AMQPTimeoutException;
use PhpAmqpLib\Message\AMQPMessage;

/** The URL's parts as php-amqplib's constructors take them. */
function url_parts(string $url): array
{
    $parts = parse_url($url);
    return [
        'tls' => $parts['scheme'] === 'amqps',
        'host' => $parts['host'],
        'port' => $parts['port'] ?? ($parts['scheme'] === 'amqps' ? 5671 : 5672),
        'user' => urldecode($parts['user'] ?? 'guest'),
        'password' => urldecode($parts['pass'] ?? 'guest'),
        'vhost' => isset($parts['path']) && strlen($parts['path']) > 1 ? urldecode(substr($parts['path'], 1)) : '/',
    ];
}

/** A connection as most applications open one: AMQPStreamConnection (AMQPLAIN, the library's default login). */
function connect(string $url, int $heartbeat = 0, string $login_method = 'AMQPLAIN', ?string $ca_file = null): AbstractConnection
{
    $u = url_parts($url);
    if ($u['tls']) {
        return new AMQPSSLConnection($u['host'], $u['port'], $u['user'], $u['password'], $u['vhost'], [
            'cafile' => $ca_file, 'verify_peer' => true, 'verify_peer_name' => true, 'peer_name' => $u['host'],
        ]);
    }
    // read_write_timeout must be at least twice the heartbeat.
    return new AMQPStreamConnection($u['host'], $u['port'], $u['user'], $u['password'], $u['vhost'], false,
        $login_method, null, 'en_US', 3.0, max(3.0, 2.0 * $heartbeat), null, false, $heartbeat);
}

/** An exclusive server-named queue. */
function private_queue(AMQPChannel $channel): string
{
    [$name] = $channel->queue_declare('', false, false, true, true);
    return $name;
}

function message_count(AMQPChannel $channel, string $queue): int
{
    [, $count] = $channel->queue_declare($queue, true);
    return $count;
}

function text(string $body): AMQPMessage
{
    return new AMQPMessage($body, ['content_type' => 'text/plain']);
}

function channel_error(AMQPProtocolChannelException $error): array
{
    return ['code' => $error->amqp_reply_code, 'text' => $error->amqp_reply_text,
            'class_id' => $error->amqp_method_sig[0], 'method_id' => $error->amqp_method_sig[1]];
}

// ---- scenarios ---------------------------------------------------------------------------

function scenario_connect(string $url): array
{
    $logins = [];
    foreach (['AMQPLAIN', 'PLAIN'] as $method) {
        $connection = connect($url, 0, $method);
        $properties = $connection->getServerProperties();
        $logins[$method] = $connection->isConnected();
        $connection->close();
    }
    $capabilities = [];
    foreach ($properties['capabilities'][1] as $name => [$type, $value]) {
        $capabilities[$name] = (bool)$value;
    }
    return ['capabilities' => $capabilities, 'server_properties' => array_keys($properties), 'logins' => $logins];
}

/** confirm_select, 100 publishes and a mandatory one nobody takes: the return comes before its ack. */
function scenario_confirms(string $url): array
{
    $connection = connect($url);
    $channel = $connection->channel();
    $channel->confirm_select();
    $queue = private_queue($channel);
    $events = [];
    $acked = [];
    $nacked = [];
    // The handlers get the published message, its publish sequence number as its delivery tag.
    $channel->set_ack_handler(function (AMQPMessage $message) use (&$events, &$acked) {
        $acked[] = $message->getDeliveryTag();
        $events[] = 'ack:' . $message->getBody();
    });
    $channel->set_nack_handler(function (AMQPMessage $message) use (&$nacked) {
        $nacked[] = $message->getDeliveryTag();
    });
    $returned = null;
    $channel->set_return_listener(function ($code, $text, $exchange, $routing_key, AMQPMessage $message) use (&$events, &$returned) {
        $events[] = 'return:' . $message->getBody();
        $returned = ['code' => $code, 'text' => $text, 'body' => $message->getBody()];
    });
    for ($i = 0; $i < 100; $i++) {
        $channel->basic_publish(text("message $i"), '', $queue);
    }
    $channel->basic_publish(text('unroutable'), '', 'no-such-queue-anywhere', true);
    $channel->wait_for_pending_acks_returns(10);
    sort($acked);
    sort($nacked);
    $result = [
        'acked' => $acked, 'nacked' => $nacked, 'returned' => $returned,
        'return_before_ack' => array_search('return:unroutable', $events, true) < array_search('ack:unroutable', $events, true),
        'message_count' => message_count($channel, $queue),
    ];
    $connection->close();
    return $result;
}

/** basic_qos(10) and a manual-ack consumer on 50 messages: ten unacked at most. */
function scenario_prefetch(string $url): array
{
    $connection = connect($url);
    $channel = $connection->channel();
    $queue = private_queue($channel);
    for ($i = 0; $i < 50; $i++) {
        $channel->basic_publish(text((string)$i), '', $queue);
    }
    message_count($channel, $queue);
    $channel->basic_qos(0, 10, false);
    $held = [];
    $bodies = [];
    $redelivered = 0;
    $acking = false;
    $channel->basic_consume($queue, '', false, false, false, false, function (AMQPMessage $message) use (&$held, &$bodies, &$redelivered, &$acking) {
        $bodies[] = $message->getBody();
        $redelivered += $message->isRedelivered() ? 1 : 0;
        if ($acking) {
            $message->ack();
        } else {
            $held[] = $message;
        }
    });
    while (count($bodies) < 10) {
        $channel->wait(null, false, 5);
    }
    try {
        $channel->wait(null, false, 0.5);  // an eleventh would break the limit
    } catch (AMQPTimeoutException $e) {
    }
    $held_before_ack = count($bodies);
    $acking = true;
    foreach ($held as $message) {
        $message->ack();
    }
    while (count($bodies) < 50) {
        $channel->wait(null, false, 5);
    }
    $result = ['held_before_ack' => $held_before_ack, 'bodies' => $bodies, 'redelivered' => $redelivered,
               'message_count' => message_count($channel, $queue)];
    $connection->close();
    return $result;
}

/** "0", "1", "2" and a consumer with prefetch 1: "0" rejected with requeue comes back first and is
 * acked, "1" is acked, "2" is rejected for good; then 200 ms for anything more (a fifth delivery). */
function scenario_reject_requeue(string $url): array
{
    $connection = connect($url);
    $channel = $connection->channel();
    $queue = private_queue($channel);
    foreach (['0', '1', '2'] as $body) {
        $channel->basic_publish(text($body), '', $queue);
    }
    $channel->basic_qos(0, 1, false);
    $deliveries = [];
    $channel->basic_consume($queue, '', false, false, false, false, function (AMQPMessage $message) use (&$deliveries) {
        $deliveries[] = ['body' => $message->getBody(), 'redelivered' => $message->isRedelivered()];
        if ($message->getBody() === '0' && !$message->isRedelivered()) {
            $message->reject(true);
        } elseif ($message->getBody() === '2') {
            $message->reject(false);
        } else {
            $message->ack();
        }
    });
    while (count($deliveries) < 4) {
        $channel->wait(null, false, 5);
    }
    try {
        $channel->wait(null, false, 0.2);
    } catch (AMQPTimeoutException $e) {  // nothing more: as it should be
    }
    $result = ['deliveries' => $deliveries, 'message_count' => message_count($channel, $queue)];
    $connection->close();
    return $result;
}

/** A passive declare of a missing queue, and an ack of an unknown tag: each closes its channel; a new one carries on. */
function scenario_channel_error(string $url): array
{
    $connection = connect($url);
    $channel = $connection->channel();
    try {
        $channel->queue_declare('no-such-queue-php', true);
        return ['error' => 'the passive declare of a missing queue succeeded'];
    } catch (AMQPProtocolChannelException $e) {
        $missing = channel_error($e);
    }
    $channel = $connection->channel();
    $queue = private_queue($channel);
    $channel->basic_ack(99);
    try {
        $channel->queue_declare($queue, true);
        return ['error' => 'no channel error after an ack of an unknown tag'];
    } catch (AMQPProtocolChannelException $e) {
        $unknown_tag = channel_error($e);
    }
    $channel = $connection->channel();
    $channel->basic_publish(text('still here'), '', $queue);
    $message = $channel->basic_get($queue, true);
    $result = ['missing_queue' => $missing, 'unknown_tag' => $unknown_tag, 'after' => $message?->getBody(),
               'connection_open' => $connection->isConnected()];
    $connection->close();
    return $result;
}

/** heartbeat 1 s, then 3 s waiting on a consumer with nothing to deliver: a plain timeout, and the connection works. */
function scenario_heartbeats(string $url): array
{
    $connection = connect($url, 1);
    $channel = $connection->channel();
    $queue = private_queue($channel);
    $bodies = [];
    $channel->basic_consume($queue, '', false, true, false, false, function (AMQPMessage $message) use (&$bodies) {
        $bodies[] = $message->getBody();
    });
    try {
        $channel->wait(null, false, 3);
        $idle = 'a delivery';
    } catch (AMQPTimeoutException $e) {
        $idle = 'timeout';
    } catch (\Throwable $e) {
        return ['heartbeat' => $connection->getHeartbeat(), 'idle' => get_class($e) . ': ' . $e->getMessage(), 'after' => null];
    }
    $channel->basic_publish(text('after the idle time'), '', $queue);
    while (!$bodies) {
        $channel->wait(null, false, 5);
    }
    $result = ['heartbeat' => $connection->getHeartbeat(), 'idle' => $idle, 'after' => $bodies[0]];
    $connection->close();
    return $result;
}

/** Bodies around one and two frames' payload, and up to 1 MiB + 1 (client_expectations.large_message_sizes),
 * each published and got back intact. php-amqplib cannot ask for a frame_max: it takes the broker's. */
function scenario_large_message(string $url): array
{
    $connection = connect($url);
    $channel = $connection->channel();
    $queue = private_queue($channel);
    $frame_max = 131072;  // the broker's, which php-amqplib takes (it does not tell)
    $payload = $frame_max - 8;
    $sizes = [0, 1, $payload - 1, $payload, $payload + 1, 2 * $payload, 2 * $payload + 1, 100000, 1 << 20, (1 << 20) + 1];
    foreach ($sizes as $size) {
        $channel->basic_publish(new AMQPMessage(pattern($size)), '', $queue);
    }
    $bodies = [];
    foreach ($sizes as $size) {
        $message = $channel->basic_get($queue, true);
        $body = $message->getBody();
        $bodies[] = ['size' => strlen($body), 'intact' => $body === pattern($size)];
    }
    $connection->close();
    return ['frame_max' => $frame_max, 'bodies' => $bodies];
}

/** AMQPSSLConnection with the test CA, the peer and its name verified: a message there and back. */
function scenario_tls(string $url, string $ca_file): array
{
    $connection = connect($url, 0, 'AMQPLAIN', $ca_file);
    $channel = $connection->channel();
    $queue = private_queue($channel);
    $channel->basic_publish(text('over tls'), '', $queue);
    $body = $channel->basic_get($queue, true)?->getBody();
    $connection->close();
    return ['body' => $body];
}

/** A confirmed publish through a memory alarm. At "ready" the test raises the alarm: the publish
 * gets connection.blocked (the block handler), and nothing more may come in the next half second
 * (what does is while_blocked). At "blocked" the test clears the alarm: connection.unblocked and
 * the ack follow. `order` is all that came, in order. */
function scenario_blocked(string $url): array
{
    $connection = connect($url);
    $order = [];
    $reason = null;
    $connection->set_connection_block_handler(function ($why) use (&$order, &$reason) {
        $order[] = 'blocked';
        $reason = $why;
    });
    $connection->set_connection_unblock_handler(function () use (&$order) {
        $order[] = 'unblocked';
    });
    $channel = $connection->channel();
    $channel->confirm_select();
    $queue = private_queue($channel);
    $channel->set_ack_handler(function () use (&$order) {
        $order[] = 'ack';
    });
    // Read frames for $seconds, or until $until() holds, waiting on $on: the connection (channel 0)
    // returns after each of its own methods, such as connection.blocked, and keeps the others for
    // later; a channel returns after each of its methods (an ack) and handles the connection's
    // (connection.unblocked) as they come.
    $read = function (AbstractChannel $on, float $seconds, callable $until) {
        $deadline = microtime(true) + $seconds;
        while (!$until() && ($left = $deadline - microtime(true)) > 0) {
            try {
                $on->wait(null, false, $left);
            } catch (AMQPTimeoutException $e) {
            }
        }
    };
    event('ready');
    $channel->basic_publish(text('held'), '', $queue);
    // (Closures with `use (&$order)`: an arrow function would see $order as it was when made.)
    $read($connection, 20, function () use (&$order) {
        return in_array('blocked', $order, true);
    });
    $seen = count($order);
    $read($channel, 0.5, fn () => false);
    $while_blocked = array_slice($order, $seen);
    event('blocked');
    $read($channel, 20, function () use (&$order) {
        return in_array('ack', $order, true) && in_array('unblocked', $order, true);
    });
    $body = $channel->basic_get($queue, true)?->getBody();
    $connection->close();
    return ['reason' => $reason, 'while_blocked' => $while_blocked, 'order' => implode(',', $order), 'body' => $body];
}

/** A consumer on a durable queue holds a persistent message unacked when, at "ready",
 * the test restarts the broker. php-amqplib has no automatic recovery: the application catches
 * the connection's close and calls reconnect() until it works, then opens its channel and
 * consumes again. */
function scenario_restart(string $url): array
{
    $queue = 'php-amqplib-restart-' . getmypid();
    $connection = connect($url);
    $channel = $connection->channel();
    $channel->queue_declare($queue, false, true, false, false);
    $channel->tx_select();  // the commit returns once the message is stored
    $channel->basic_publish(new AMQPMessage('in flight', ['delivery_mode' => AMQPMessage::DELIVERY_MODE_PERSISTENT]), '', $queue);
    $channel->tx_commit();
    $deliveries = [];
    $consume = function (AMQPChannel $channel, bool $ack) use ($queue, &$deliveries) {
        $channel->basic_consume($queue, '', false, false, false, false, function (AMQPMessage $message) use (&$deliveries, $ack) {
            $deliveries[] = ['body' => $message->getBody(), 'redelivered' => $message->isRedelivered()];
            if ($ack) {
                $message->ack();
            }
        });
    };
    $consume($channel, false);
    while (!$deliveries) {
        $channel->wait(null, false, 10);
    }
    event('ready');
    try {
        $channel->wait(null, false, 20);
        return ['error' => 'the broker restarted and nothing was noticed'];
    } catch (AMQPConnectionClosedException $e) {
        $closed = ['class' => 'AMQPConnectionClosedException', 'code' => $e->getCode(), 'message' => $e->getMessage()];
    }
    $attempts = 0;
    while (true) {
        $attempts++;
        try {
            $connection->reconnect();
            break;
        } catch (\Throwable $e) {
            if ($attempts > 150) {
                return ['error' => 'no connection within 30 s of the restart: ' . $e->getMessage()];
            }
            usleep(200000);
        }
    }
    $deliveries = [];
    $channel = $connection->channel();
    $channel->queue_declare($queue, false, true, false, false);
    $consume($channel, true);
    while (!$deliveries) {
        $channel->wait(null, false, 10);
    }
    $channel->basic_publish(new AMQPMessage('after the restart'), '', $queue);
    while (count($deliveries) < 2) {
        $channel->wait(null, false, 10);
    }
    $channel->queue_delete($queue);
    $connection->close();
    return ['closed' => $closed, 'reconnected' => true, 'deliveries' => $deliveries];
}

run_scenario($argv);
