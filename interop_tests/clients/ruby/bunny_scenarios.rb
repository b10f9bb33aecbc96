# Scenarios of bunny (Debian's ruby-bunny 2.19) against a broker, for
# interop_tests/test_client_ruby.py.
#
#     ruby bunny_scenarios.rb <scenario> <amqp-url> [ca-file]
#
# Each scenario does what an application on bunny does and prints, as its last line, one JSON
# object: {"ok": true, ...what it observed...}, or {"ok": false, "error": "..."}. The interactive
# ones (blocked, restart) first print {"event": ...} lines and wait for a line on stdin while the
# test changes the broker. The test asserts on the JSON.

require "bunny"
require "json"
require "logger"

$stdout.sync = true
OUTPUT = Mutex.new

def emit(object)
  OUTPUT.synchronize { puts JSON.generate(object) }
end

# Tells the test where the scenario is, then waits for its line on stdin.
def event(name)
  emit({ "event" => name })
  raise "the test closed stdin at event #{name}" if $stdin.gets.nil?
end

# bunny logs to standard output unless told otherwise: keep it for the JSON.
LOGGER = Logger.new($stderr, level: Logger::WARN)

def connect(url, **options)
  connection = Bunny.new(url, logger: LOGGER, automatically_recover: false, **options)
  connection.start
  connection
end

# Connects, opens a channel and declares an exclusive server-named queue; yields the three and
# closes the connection after the block. The block's value.
def with_private_queue(url, **options)
  connection = connect(url, **options)
  channel = connection.create_channel
  result = yield connection, channel, private_queue(channel)
  connection.close
  result
end

# Waits until the block returns true, or fails after `seconds`.
def wait_until(seconds = 10, what = "the consumer")
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  until yield
    raise "#{what}: not within #{seconds} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    sleep 0.01
  end
end

def private_queue(channel)
  channel.queue("", exclusive: true)
end

def message_count(channel, name)
  channel.queue_declare(name, passive: true).message_count
end

def pattern(size)
  # byte i is (i * 31 + 7) % 251, as in the other languages' scenarios; it repeats every 251 bytes.
  cycle = (0...251).map { |i| ((i * 31 + 7) % 251).chr }.join.b
  (cycle * (size / 251 + 1))[0, size]
end

def channel_error(error)
  close = error.channel_close
  { "class" => error.class.name, "code" => close.reply_code, "text" => close.reply_text,
    "class_id" => close.class_id, "method_id" => close.method_id }
end

# ---- scenarios -------------------------------------------------------------------------------

def scenario_connect(url)
  connection = connect(url)
  result = { "capabilities" => connection.server_capabilities, "server_properties" => connection.server_properties.keys,
             "channel_max" => connection.channel_max, "frame_max" => connection.frame_max,
             "heartbeat" => connection.heartbeat, "mechanism" => connection.mechanism }
  connection.close
  result
end

# confirm_select, 100 publishes and a mandatory one nobody takes: its return comes before its ack.
def scenario_confirms(url)
  with_private_queue(url) do |_connection, channel, queue|
    events = Queue.new
    acked = []
    nacked = []
    channel.confirm_select(proc { |tag, multiple, nack|
      tags = multiple ? (1..tag).to_a - acked - nacked : [tag]
      (nack ? nacked : acked).concat(tags)
      events << "ack:#{tag}"
    })
    returned = nil
    # One exchange object: each call of default_exchange makes a new one, and the channel hands a
    # return to the latest.
    exchange = channel.default_exchange
    exchange.on_return do |info, _properties, body|
      returned = { "code" => info.reply_code, "text" => info.reply_text, "body" => body }
      events << "return"
    end
    100.times { |i| exchange.publish("message #{i}", routing_key: queue.name, content_type: "text/plain") }
    exchange.publish("unroutable", routing_key: "no-such-queue-anywhere", mandatory: true)
    all_confirmed = channel.wait_for_confirms
    wait_until(5, "the return") { returned } # handed to on_return on the consumer thread
    order = []
    order << events.pop until events.empty?
    { "acked" => acked.sort, "nacked" => nacked.sort, "all_confirmed" => all_confirmed, "returned" => returned,
      "return_before_ack" => order.index("return") < order.index("ack:101"),
      "message_count" => message_count(channel, queue.name) }
  end
end

# prefetch(10) and a manual-ack consumer on 50 messages: ten unacked at most.
def scenario_prefetch(url)
  with_private_queue(url) do |_connection, channel, queue|
    50.times { |i| channel.default_exchange.publish(i.to_s, routing_key: queue.name) }
    message_count(channel, queue.name)
    channel.prefetch(10)
    received = []
    held = []
    redelivered = 0
    acking = false
    lock = Mutex.new
    queue.subscribe(manual_ack: true) do |info, _properties, body|
      lock.synchronize do
        received << body
        redelivered += 1 if info.redelivered?
        acking ? channel.ack(info.delivery_tag) : held << info.delivery_tag
      end
    end
    wait_until { lock.synchronize { received.size >= 10 } }
    sleep 0.5 # an eleventh delivery would break the limit
    held_before_ack = lock.synchronize do
      acking = true
      held.each { |tag| channel.ack(tag) }
      received.size
    end
    wait_until { lock.synchronize { received.size >= 50 } }
    { "held_before_ack" => held_before_ack, "bodies" => received, "redelivered" => redelivered,
      "message_count" => message_count(channel, queue.name) }
  end
end

# "0", "1", "2" and a consumer with prefetch 1: "0" rejected with requeue comes back first and is
# acked, "1" is acked, "2" is rejected for good; then 200 ms for anything more (a fifth delivery).
def scenario_reject_requeue(url)
  with_private_queue(url) do |_connection, channel, queue|
    channel.prefetch(1)
    %w[0 1 2].each { |body| channel.default_exchange.publish(body, routing_key: queue.name) }
    deliveries = Queue.new
    queue.subscribe(manual_ack: true) do |info, _properties, body|
      deliveries << { "body" => body, "redelivered" => info.redelivered? }
      if body == "0" && !info.redelivered?
        channel.reject(info.delivery_tag, true)
      elsif body == "2"
        channel.reject(info.delivery_tag, false)
      else
        channel.ack(info.delivery_tag)
      end
    end
    wait_until { deliveries.size >= 4 }
    sleep 0.2 # nothing more may come
    seen = []
    seen << deliveries.pop until deliveries.empty?
    { "deliveries" => seen, "message_count" => message_count(channel, queue.name) }
  end
end

# A passive declare of a missing queue (raised at once), and an ack of an unknown tag (the broker
# closes the channel after it): a new channel carries on.
def scenario_channel_error(url)
  connection = connect(url)
  channel = connection.create_channel
  begin
    channel.queue_declare("no-such-queue-ruby", passive: true)
    return { "error" => "the passive declare of a missing queue succeeded" }
  rescue Bunny::NotFound => e
    missing = channel_error(e)
  end
  channel = connection.create_channel
  unknown_tag = nil
  # bunny hands the close that follows an ack, reject or nack (they have no reply) to on_error.
  channel.on_error do |_channel, close|
    unknown_tag = { "code" => close.reply_code, "text" => close.reply_text, "class_id" => close.class_id,
                    "method_id" => close.method_id }
  end
  queue = private_queue(channel)
  channel.ack(99)
  wait_until(5, "the channel's close") { unknown_tag }
  unknown_tag["channel_open"] = channel.open?
  channel = connection.create_channel
  channel.default_exchange.publish("still here", routing_key: queue.name)
  _info, _properties, body = channel.basic_get(queue.name, manual_ack: false)
  result = { "missing_queue" => missing, "unknown_tag" => unknown_tag, "after" => body,
             "connection_open" => connection.open? }
  connection.close
  result
end

# heartbeat 1 s, then 3 s with nothing to do: bunny's heartbeat sender and reader keep the
# connection; a message goes through afterwards.
def scenario_heartbeats(url)
  with_private_queue(url, heartbeat: 1) do |connection, channel, queue|
    bodies = []
    queue.subscribe { |_info, _properties, body| bodies << body }
    sleep 3
    open_after_idle = connection.open?
    channel.default_exchange.publish("after the idle time", routing_key: queue.name)
    wait_until { !bodies.empty? }
    { "heartbeat" => connection.heartbeat, "open_after_idle" => open_after_idle, "after" => bodies.first }
  end
end

# frame_max 4096: bodies around one and two frames' payload, and up to 1 MiB + 1
# (client_expectations.large_message_sizes), each published and got back intact.
def scenario_large_message(url)
  with_private_queue(url, frame_max: 4096) do |connection, channel, queue|
    payload = connection.frame_max - 8
    sizes = [0, 1, payload - 1, payload, payload + 1, 2 * payload, 2 * payload + 1, 100_000, 1 << 20, (1 << 20) + 1]
    sizes.each { |size| channel.default_exchange.publish(pattern(size), routing_key: queue.name) }
    bodies = sizes.map do |size|
      _info, _properties, body = channel.basic_get(queue.name, manual_ack: false)
      { "size" => body.bytesize, "intact" => body.b == pattern(size) }
    end
    { "frame_max" => connection.frame_max, "bodies" => bodies }
  end
end

# amqps with the test CA, the peer verified (bunny then checks the host name too): a message there and back.
def scenario_tls(url, ca_file)
  with_private_queue(url, tls_ca_certificates: [ca_file], verify_peer: true) do |_connection, channel, queue|
    channel.default_exchange.publish("over tls", routing_key: queue.name)
    _info, _properties, body = channel.basic_get(queue.name, manual_ack: false)
    { "body" => body }
  end
end

# A confirmed publish through a memory alarm. At "ready" the test raises the alarm: the publish
# gets connection.blocked (on_blocked), and nothing more may come in the next half second (what
# does is while_blocked). At "blocked" the test clears the alarm: connection.unblocked
# (on_unblocked) and the ack follow. `order` is all that came, in order.
def scenario_blocked(url)
  order = Queue.new
  seen = []
  take = lambda do # what came so far, in order
    seen << order.pop until order.empty?
    seen
  end
  reason = nil
  with_private_queue(url) do |connection, channel, queue|
    connection.on_blocked do |blocked|
      reason = blocked.reason
      order << "blocked"
    end
    connection.on_unblocked { order << "unblocked" }
    channel.confirm_select(proc { order << "ack" })
    event("ready")
    channel.default_exchange.publish("held", routing_key: queue.name)
    wait_until(20, "connection.blocked") { take.call.include?("blocked") }
    before = seen.size
    sleep 0.5 # the alarm lasts: nothing more may come
    while_blocked = take.call[before..]
    event("blocked")
    confirmed = channel.wait_for_confirms
    wait_until(5, "connection.unblocked") { take.call.include?("unblocked") }
    _info, _properties, body = channel.basic_get(queue.name, manual_ack: false)
    { "reason" => reason, "while_blocked" => while_blocked, "order" => seen.join(","), "confirmed" => confirmed,
      "body" => body }
  end
end

# bunny's automatic recovery: a consumer on a durable queue holds a persistent message unacked when,
# at "ready", the test restarts the broker. bunny reconnects, opens the channel again, declares the queue, consumes
# again; the message comes back redelivered, then one published after the recovery.
def scenario_restart(url)
  name = "bunny-restart-#{Process.pid}"
  recovery = []
  connection = Bunny.new(url, logger: LOGGER, automatically_recover: true, network_recovery_interval: 0.2,
                              recovery_attempts: 150)
  connection.before_recovery_attempt_starts { recovery << "attempt" }
  connection.after_recovery_completed { recovery << "completed" }
  connection.start
  publisher = connection.create_channel
  publisher.tx_select # the commit returns once the message is stored
  publisher.queue(name, durable: true)
  publisher.default_exchange.publish("in flight", routing_key: name, persistent: true)
  publisher.tx_commit
  publisher.close
  channel = connection.create_channel
  queue = channel.queue(name, durable: true)
  deliveries = []
  lock = Mutex.new
  queue.subscribe(manual_ack: true) do |info, _properties, body|
    lock.synchronize do
      deliveries << { "body" => body, "redelivered" => info.redelivered? }
      channel.ack(info.delivery_tag) if deliveries.size > 1 # the first stays unacked over the restart
    end
  end
  # A server-named exclusive queue bound to amq.fanout: gone with the connection, so bunny
  # declares it again (the broker names it anew) and binds it again.
  fanned_out = Queue.new
  server_named = channel.queue("", exclusive: true).bind("amq.fanout", routing_key: name)
  first_name = server_named.name
  server_named.subscribe { |_info, _properties, body| fanned_out << body }
  wait_until { lock.synchronize { deliveries.size == 1 } }
  event("ready")
  wait_until(30, "the recovery") { recovery.include?("completed") }
  wait_until(10, "the unacked message again") { lock.synchronize { deliveries.size >= 2 } }
  channel.default_exchange.publish("after the restart", routing_key: name)
  wait_until(10, "the message published after the recovery") { lock.synchronize { deliveries.size >= 3 } }
  channel.fanout("amq.fanout", durable: true).publish("fanned out after the restart")
  wait_until(10, "the fanned-out message") { !fanned_out.empty? }
  fanned = fanned_out.pop
  queue.delete
  connection.close
  { "recovery" => recovery.uniq, "deliveries" => deliveries, "server_named" => {
    "renamed" => server_named.name != first_name, "prefix" => server_named.name[0, 8], "received" => fanned } }
end

scenario, url, ca_file = ARGV
SCENARIOS = %w[connect confirms prefetch reject_requeue channel_error heartbeats large_message tls blocked
               restart].freeze
unless SCENARIOS.include?(scenario) && url
  emit({ "ok" => false, "error" => "usage: ruby bunny_scenarios.rb <#{SCENARIOS.join('|')}> <amqp-url> [ca-file]" })
  exit 1
end
begin
  result = scenario == "tls" ? scenario_tls(url, ca_file) : send("scenario_#{scenario}", url)
rescue StandardError => e
  emit({ "ok" => false, "error" => "#{e.class}: #{e.message} at #{e.backtrace&.first}" })
  exit 1
end
if result.key?("error")
  emit({ "ok" => false }.merge(result))
  exit 1
end
emit({ "ok" => true }.merge(result))
