# Scenarios of bunny (Debian's ruby-bunny 2.19) against a broker, for
# interop_tests/test_client_ruby.py.
#
#     ruby bunny_scenarios.rb <scenario> <amqp-url> [ca-file]
#
# Each scenario does what an application on bunny does and prints, as its last line, one JSON
# object: {"ok": true, ...what it observed...}, or {"ok": false, "error": "..."}. While it runs it
# may print {"event": ...} lines the test waits for. The test asserts on the JSON.

require "bunny"
require "json"
require "logger"

$stdout.sync = true
OUTPUT = Mutex.new

def emit(object)
  OUTPUT.synchronize { puts JSON.generate(object) }
end

def event(name)
  emit({ "event" => name })
end

# bunny logs to standard output unless told otherwise: keep it for the JSON.
LOGGER = Logger.new($stderr, level: Logger::WARN)

def connect(url, **options)
  connection = Bunny.new(url, logger: LOGGER, automatically_recover: false, **options)
  connection.start
  connection
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

# confirm_select, 20 publishes and a mandatory one nobody takes: its return comes before its ack.
def scenario_confirms(url)
  connection = connect(url)
  channel = connection.create_channel
  events = Queue.new
  acked = []
  nacked = 0
  channel.confirm_select(proc { |tag, multiple, nack|
    tags = multiple ? (1..tag).to_a - acked : [tag]
    nack ? nacked += tags.size : acked.concat(tags)
    events << "ack:#{tag}"
  })
  queue = private_queue(channel)
  returned = nil
  # One exchange object: each call of default_exchange makes a new one, and the channel hands a
  # return to the latest.
  exchange = channel.default_exchange
  exchange.on_return do |info, _properties, body|
    returned = { "code" => info.reply_code, "text" => info.reply_text, "body" => body }
    events << "return"
  end
  20.times { |i| exchange.publish("message #{i}", routing_key: queue.name, content_type: "text/plain") }
  exchange.publish("unroutable", routing_key: "no-such-queue-anywhere", mandatory: true)
  all_confirmed = channel.wait_for_confirms
  wait_until(5, "the return") { returned } # handed to on_return on the consumer thread
  order = []
  order << events.pop until events.empty?
  result = { "acked" => acked.sort, "nacked" => nacked, "all_confirmed" => all_confirmed, "returned" => returned,
             "return_before_ack" => order.index("return") < order.index("ack:21"),
             "message_count" => message_count(channel, queue.name) }
  connection.close
  result
end

# prefetch(3) and a manual-ack consumer on 10 messages: three unacked at most.
def scenario_prefetch(url)
  connection = connect(url)
  channel = connection.create_channel
  queue = private_queue(channel)
  10.times { |i| channel.default_exchange.publish(i.to_s, routing_key: queue.name) }
  message_count(channel, queue.name)
  channel.prefetch(3)
  bodies = Queue.new
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
  wait_until { lock.synchronize { received.size >= 3 } }
  sleep 0.5 # a fourth delivery would break the limit
  held_before_ack = lock.synchronize do
    acking = true
    held.each { |tag| channel.ack(tag) }
    received.size
  end
  wait_until { lock.synchronize { received.size >= 10 } }
  result = { "held_before_ack" => held_before_ack, "bodies" => received, "redelivered" => redelivered,
             "message_count" => message_count(channel, queue.name) }
  connection.close
  result
end

# Prefetch 1: "first" rejected with requeue comes back redelivered and is acked; "second" is rejected for good.
def scenario_reject(url)
  connection = connect(url)
  channel = connection.create_channel
  channel.prefetch(1)
  queue = private_queue(channel)
  channel.default_exchange.publish("first", routing_key: queue.name)
  channel.default_exchange.publish("second", routing_key: queue.name)
  deliveries = []
  rejected_first = false
  queue.subscribe(manual_ack: true) do |info, _properties, body|
    if body == "first" && !rejected_first
      channel.reject(info.delivery_tag, true)
      rejected_first = true
      action = "requeued"
    elsif body == "first"
      channel.ack(info.delivery_tag)
      action = "acked"
    else
      channel.reject(info.delivery_tag, false)
      action = "dropped"
    end
    deliveries << { "body" => body, "redelivered" => info.redelivered?, "action" => action }
  end
  wait_until { deliveries.size >= 3 }
  result = { "deliveries" => deliveries, "message_count" => message_count(channel, queue.name) }
  connection.close
  result
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
def scenario_heartbeat(url)
  connection = connect(url, heartbeat: 1)
  channel = connection.create_channel
  queue = private_queue(channel)
  bodies = []
  queue.subscribe { |_info, _properties, body| bodies << body }
  sleep 3
  open_after_idle = connection.open?
  channel.default_exchange.publish("after the idle time", routing_key: queue.name)
  wait_until { !bodies.empty? }
  result = { "heartbeat" => connection.heartbeat, "open_after_idle" => open_after_idle, "after" => bodies.first }
  connection.close
  result
end

# frame_max 4096: bodies of exactly one frame's payload, one byte more, and 1 MiB + 1.
def scenario_large(url)
  connection = connect(url, frame_max: 4096)
  channel = connection.create_channel
  queue = private_queue(channel)
  sizes = [4096 - 8, 4096 - 7, (1 << 20) + 1]
  sizes.each { |size| channel.default_exchange.publish(pattern(size), routing_key: queue.name) }
  bodies = sizes.map do |size|
    _info, _properties, body = channel.basic_get(queue.name, manual_ack: false)
    { "size" => body.bytesize, "intact" => body.b == pattern(size) }
  end
  result = { "frame_max" => connection.frame_max, "bodies" => bodies }
  connection.close
  result
end

# amqps with the test CA, the peer verified (bunny then checks the host name too): a message there and back.
def scenario_tls(url, ca_file)
  connection = connect(url, tls_ca_certificates: [ca_file], verify_peer: true)
  channel = connection.create_channel
  queue = private_queue(channel)
  channel.default_exchange.publish("over tls", routing_key: queue.name)
  _info, _properties, body = channel.basic_get(queue.name, manual_ack: false)
  connection.close
  { "body" => body }
end

# The memory alarm is set: a confirmed publish gets connection.blocked (on_blocked), then, once the
# test clears the alarm, connection.unblocked (on_unblocked) and the ack.
def scenario_blocked(url)
  connection = connect(url)
  order = Queue.new
  reason = nil
  connection.on_blocked do |blocked|
    reason = blocked.reason
    order << "blocked"
    event("blocked")
  end
  connection.on_unblocked { order << "unblocked" }
  channel = connection.create_channel
  channel.confirm_select(proc { order << "ack"; event("ack") })
  queue = private_queue(channel)
  channel.default_exchange.publish("held", routing_key: queue.name)
  event("published")
  confirmed = channel.wait_for_confirms
  seen = []
  wait_until(5, "connection.unblocked") do
    seen << order.pop until order.empty?
    seen.include?("unblocked")
  end
  _info, _properties, body = channel.basic_get(queue.name, manual_ack: false)
  connection.close
  { "reason" => reason, "order" => seen.join(","), "confirmed" => confirmed, "body" => body }
end

# bunny's automatic recovery: a consumer on a durable queue holds a persistent message unacked when
# the broker restarts. bunny reconnects, opens the channel again, declares the queue, consumes
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
  event("consuming")
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
SCENARIOS = %w[connect confirms prefetch reject channel_error heartbeat large tls blocked restart].freeze
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
