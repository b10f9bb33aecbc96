// RabbitMQ's Java client (Debian's librabbitmq-client-java) against a broker, one scenario per run:
//
//     java -cp <classes>:amqp-client.jar:slf4j-api.jar:slf4j-simple.jar Scenarios <scenario> <url> [ca.pem]
//
// Each scenario prints what an application would notice as one JSON object on the last line of
// stdout ({"ok": true, ...}); interop_tests/test_client_java.py asserts on it. The interactive
// scenarios (blocked, restart) first print {"event": ...} lines and wait for a line on stdin,
// while the test changes the broker (raises an alarm, restarts it).

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.BlockedListener;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.Recoverable;
import com.rabbitmq.client.RecoveryListener;
import com.rabbitmq.client.ShutdownSignalException;

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.SortedSet;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

public class Scenarios {
    static final long WAIT_MS = 10_000;
    static final String TOKEN = UUID.randomUUID().toString().substring(0, 8);
    static final BufferedReader STDIN = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));

    public static void main(String[] args) {
        Map<String, Object> report = new LinkedHashMap<>();
        int status = 0;
        try {
            String scenario = args[0];
            String url = args[1];
            switch (scenario) {
                case "connect": connect(url, report); break;
                case "confirms": confirms(url, report); break;
                case "prefetch": prefetch(url, report); break;
                case "reject_requeue": rejectRequeue(url, report); break;
                case "channel_error": channelError(url, report); break;
                case "heartbeats": heartbeats(url, report); break;
                case "large_message": largeMessage(url, report); break;
                case "tls": tls(url, args[2], report); break;
                case "blocked": blocked(url, report); break;
                case "restart": restart(url, report); break;
                default: throw new IllegalArgumentException("unknown scenario " + scenario);
            }
            report.put("ok", true);
        } catch (Throwable error) {
            report.put("ok", false);
            java.io.StringWriter trace = new java.io.StringWriter();
            error.printStackTrace(new java.io.PrintWriter(trace));
            report.put("error", trace.toString());
            status = 1;
        }
        System.out.println(json(report));
        System.out.flush();
        // The client's threads (heartbeats, recovery) are not daemons: end here, whatever they do.
        System.exit(status);
    }

    static ConnectionFactory factory(String url) throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(url);
        factory.setConnectionTimeout((int) WAIT_MS);
        return factory;
    }

    // ---- connect: the handshake as the application sees it

    static void connect(String url, Map<String, Object> report) throws Exception {
        try (Connection connection = factory(url).newConnection("java-connect")) {
            Map<String, Object> server = connection.getServerProperties();
            report.put("product", String.valueOf(server.get("product")));
            report.put("serverCapabilities", stringify(server.get("capabilities")));
            report.put("clientCapabilities", stringify(connection.getClientProperties().get("capabilities")));
            report.put("frameMax", connection.getFrameMax());
            report.put("channelMax", connection.getChannelMax());
            report.put("heartbeat", connection.getHeartbeat());
            Channel channel = connection.createChannel();
            String queue = channel.queueDeclare().getQueue();
            report.put("queue", queue);
            channel.basicPublish("", queue, null, "hello".getBytes(StandardCharsets.UTF_8));
            GetResponse got = poll(channel, queue);
            report.put("body", text(got.getBody()));
        }
    }

    // ---- confirms: every publish acked, an unroutable mandatory one returned before its ack

    static void confirms(String url, Map<String, Object> report) throws Exception {
        try (Connection connection = factory(url).newConnection("java-confirms")) {
            Channel channel = connection.createChannel();
            String queue = channel.queueDeclare().getQueue();
            channel.confirmSelect();
            SortedSet<Long> outstanding = Collections.synchronizedSortedSet(new TreeSet<>());
            List<Long> acked = Collections.synchronizedList(new ArrayList<>());
            List<Long> nacked = Collections.synchronizedList(new ArrayList<>());
            List<Map<String, Object>> returns = Collections.synchronizedList(new ArrayList<>());
            int count = 100;
            long unroutableTag = count + 1;  // the channel's publish sequence numbers start at 1
            List<Boolean> returnedBeforeAck = Collections.synchronizedList(new ArrayList<>());
            channel.addConfirmListener(new ConfirmListener() {
                public void handleAck(long tag, boolean multiple) { settle(tag, multiple, acked); }
                public void handleNack(long tag, boolean multiple) { settle(tag, multiple, nacked); }

                void settle(long tag, boolean multiple, List<Long> into) {
                    synchronized (outstanding) {
                        Collection<Long> settled = multiple ? new ArrayList<>(outstanding.headSet(tag + 1))
                                                            : Collections.singletonList(tag);
                        for (Long each : settled) {
                            into.add(each);
                            if (each == unroutableTag) returnedBeforeAck.add(!returns.isEmpty());
                        }
                        outstanding.removeAll(settled);
                    }
                }
            });
            channel.addReturnListener((code, text, exchange, key, properties, body) -> {
                Map<String, Object> returned = new LinkedHashMap<>();
                returned.put("replyCode", code);
                returned.put("replyText", text);
                returned.put("routingKey", key);
                returned.put("body", text(body));
                returns.add(returned);
            });
            for (int i = 0; i < count; i++) {
                outstanding.add(channel.getNextPublishSeqNo());
                byte[] body = i % 10 == 0 ? new byte[10_000] : ("message " + i).getBytes(StandardCharsets.UTF_8);
                channel.basicPublish("", queue, props("m" + i), body);
            }
            outstanding.add(channel.getNextPublishSeqNo());
            channel.basicPublish("", "no-such-queue-" + TOKEN, true, props("unroutable"),
                                 "unroutable".getBytes(StandardCharsets.UTF_8));
            report.put("allConfirmed", channel.waitForConfirms(WAIT_MS));
            report.put("published", count + 1);
            report.put("acked", sorted(acked));
            report.put("nacked", sorted(nacked));
            report.put("returns", returns);
            report.put("returnedBeforeAck", returnedBeforeAck);
            report.put("messageCount", channel.queueDeclarePassive(queue).getMessageCount());
        }
    }

    // ---- prefetch: a manual-ack consumer holds at most its prefetch, then gets everything in order

    static void prefetch(String url, Map<String, Object> report) throws Exception {
        int prefetch = 10;
        int count = 50;
        try (Connection connection = factory(url).newConnection("java-prefetch")) {
            Channel channel = connection.createChannel();
            String queue = channel.queueDeclare().getQueue();
            publishConfirmed(connection, queue, count);
            channel.basicQos(prefetch);
            BlockingQueue<Delivery> arrived = new LinkedBlockingQueue<>();
            channel.basicConsume(queue, false, (tag, delivery) -> arrived.add(delivery), tag -> { });
            List<String> bodies = new ArrayList<>();
            Delivery last = null;
            for (int i = 0; i < prefetch; i++) {
                last = take(arrived);
                bodies.add(text(last.getBody()));
            }
            Thread.sleep(300);  // a broker ignoring the prefetch would have sent more by now
            report.put("heldUnacked", bodies.size() + arrived.size());
            channel.basicAck(last.getEnvelope().getDeliveryTag(), true);  // the first ten at once
            while (bodies.size() < count) {
                Delivery delivery = take(arrived);
                bodies.add(text(delivery.getBody()));
                channel.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
            }
            report.put("bodies", bodies);
            AMQP.Queue.DeclareOk after = channel.queueDeclarePassive(queue);
            report.put("messageCount", after.getMessageCount());
            report.put("consumerCount", after.getConsumerCount());
        }
    }

    // ---- reject and requeue: the rejected message comes back first, marked redelivered

    static void rejectRequeue(String url, Map<String, Object> report) throws Exception {
        try (Connection connection = factory(url).newConnection("java-reject")) {
            Channel channel = connection.createChannel();
            String queue = channel.queueDeclare().getQueue();
            publishConfirmed(connection, queue, 3);  // bodies "0", "1", "2"
            channel.basicQos(1);
            List<Map<String, Object>> deliveries = Collections.synchronizedList(new ArrayList<>());
            CountDownLatch done = new CountDownLatch(4);
            channel.basicConsume(queue, false, (tag, delivery) -> {
                String body = text(delivery.getBody());
                boolean redelivered = delivery.getEnvelope().isRedeliver();
                Map<String, Object> seen = new LinkedHashMap<>();
                seen.put("body", body);
                seen.put("redelivered", redelivered);
                deliveries.add(seen);
                long deliveryTag = delivery.getEnvelope().getDeliveryTag();
                if (body.equals("0") && !redelivered) {
                    channel.basicReject(deliveryTag, true);   // back to the queue
                } else if (body.equals("2")) {
                    channel.basicReject(deliveryTag, false);  // dropped (no dead-letter exchange)
                } else {
                    channel.basicAck(deliveryTag, false);
                }
                done.countDown();
            }, tag -> { });
            await(done, "four deliveries");
            Thread.sleep(200);  // nothing more may come
            report.put("deliveries", new ArrayList<>(deliveries));
            report.put("messageCount", channel.queueDeclarePassive(queue).getMessageCount());
        }
    }

    // ---- a channel error closes the channel only; the application carries on

    static void channelError(String url, Map<String, Object> report) throws Exception {
        try (Connection connection = factory(url).newConnection("java-channel-error")) {
            String missing = "java-missing-" + TOKEN;
            Channel channel = connection.createChannel();
            report.put("missing", missing);
            report.put("notFound", channelClose(() -> channel.queueDeclarePassive(missing)));
            report.put("channelOpenAfter", channel.isOpen());
            report.put("connectionOpenAfter", connection.isOpen());

            Channel second = connection.createChannel();
            String queue = "java-plain-" + TOKEN;
            second.queueDeclare(queue, false, false, true, null);
            report.put("queue", queue);
            report.put("inequivalent", channelClose(() -> second.queueDeclare(queue, true, false, true, null)));

            Channel third = connection.createChannel();
            third.basicPublish("", queue, null, "still here".getBytes(StandardCharsets.UTF_8));
            report.put("bodyAfter", text(poll(third, queue).getBody()));
            third.queueDelete(queue);
        }
    }

    interface Call { void run() throws IOException; }

    static Map<String, Object> channelClose(Call call) {
        try {
            call.run();
        } catch (IOException error) {
            ShutdownSignalException signal = (ShutdownSignalException) error.getCause();
            AMQP.Channel.Close close = (AMQP.Channel.Close) signal.getReason();
            Map<String, Object> seen = new LinkedHashMap<>();
            seen.put("replyCode", close.getReplyCode());
            seen.put("replyText", close.getReplyText());
            seen.put("classId", close.getClassId());
            seen.put("methodId", close.getMethodId());
            seen.put("hardError", signal.isHardError());
            return seen;
        }
        throw new AssertionError("no channel error");
    }

    // ---- heartbeats: a 1 s heartbeat keeps an idle connection open

    static void heartbeats(String url, Map<String, Object> report) throws Exception {
        ConnectionFactory factory = factory(url);
        factory.setRequestedHeartbeat(1);
        List<String> shutdowns = Collections.synchronizedList(new ArrayList<>());
        try (Connection connection = factory.newConnection("java-heartbeats")) {
            connection.addShutdownListener(cause -> shutdowns.add(String.valueOf(cause.getMessage())));
            report.put("heartbeat", connection.getHeartbeat());
            // The client calls a peer dead after about two silent intervals; the broker likewise.
            Thread.sleep(4_000);
            report.put("openAfterIdle", connection.isOpen());
            Channel channel = connection.createChannel();
            String queue = channel.queueDeclare().getQueue();
            channel.basicPublish("", queue, null, "after the idle time".getBytes(StandardCharsets.UTF_8));
            report.put("bodyAfterIdle", text(poll(channel, queue).getBody()));
        }
        report.put("unexpectedShutdowns", shutdowns.stream().filter(s -> !s.contains("clean connection shutdown")).toArray());
    }

    // ---- messages larger than a frame (frame_max 4096): bodies around one and two frames' payload,
    // and up to 1 MiB + 1 (client_expectations.large_message_sizes), each got back intact

    static void largeMessage(String url, Map<String, Object> report) throws Exception {
        ConnectionFactory factory = factory(url);
        factory.setRequestedFrameMax(4096);
        try (Connection connection = factory.newConnection("java-large")) {
            report.put("frameMax", connection.getFrameMax());
            int payload = connection.getFrameMax() - 8;
            int[] sizes = {0, 1, payload - 1, payload, payload + 1, 2 * payload, 2 * payload + 1, 100_000,
                           1 << 20, (1 << 20) + 1};
            Channel channel = connection.createChannel();
            String queue = channel.queueDeclare().getQueue();
            channel.confirmSelect();
            for (int size : sizes) channel.basicPublish("", queue, props("size-" + size), pattern(size));
            channel.waitForConfirmsOrDie(WAIT_MS);
            BlockingQueue<Delivery> arrived = new LinkedBlockingQueue<>();
            channel.basicConsume(queue, false, (tag, delivery) -> arrived.add(delivery), tag -> { });
            List<Map<String, Object>> bodies = new ArrayList<>();
            for (int i = 0; i < sizes.length; i++) {
                Delivery delivery = take(arrived);
                byte[] body = delivery.getBody();
                Map<String, Object> seen = new LinkedHashMap<>();
                seen.put("size", body.length);
                seen.put("intact", java.util.Arrays.equals(body, pattern(body.length)));
                bodies.add(seen);
                channel.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
            }
            report.put("bodies", bodies);
        }
    }

    // Byte i is (i * 31 + 7) % 251, as in the other languages' scenarios.
    static byte[] pattern(int size) {
        byte[] body = new byte[size];
        for (int i = 0; i < size; i++) body[i] = (byte) ((i * 31L + 7) % 251);
        return body;
    }

    // ---- TLS: amqps with the test CA as the only trusted root

    static void tls(String url, String caFile, Map<String, Object> report) throws Exception {
        X509Certificate ca;
        try (FileInputStream in = new FileInputStream(caFile)) {
            ca = (X509Certificate) CertificateFactory.getInstance("X.509").generateCertificate(in);
        }
        KeyStore trusted = KeyStore.getInstance(KeyStore.getDefaultType());
        trusted.load(null, null);
        trusted.setCertificateEntry("test-ca", ca);
        TrustManagerFactory trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        trust.init(trusted);
        SSLContext context = SSLContext.getInstance("TLSv1.2");
        context.init(null, trust.getTrustManagers(), null);
        ConnectionFactory factory = factory(url);  // amqps:// selects TLS (trusting anything) ...
        factory.useSslProtocol(context);          // ... and this trusts only the test CA
        try (Connection connection = factory.newConnection("java-tls")) {
            report.put("ssl", factory.isSSL());
            Channel channel = connection.createChannel();
            String queue = channel.queueDeclare().getQueue();
            channel.basicPublish("", queue, null, "over tls".getBytes(StandardCharsets.UTF_8));
            report.put("body", text(poll(channel, queue).getBody()));
        }
    }

    // ---- connection.blocked under a memory alarm (interactive)

    static void blocked(String url, Map<String, Object> report) throws Exception {
        ConnectionFactory factory = factory(url);
        try (Connection publisher = factory.newConnection("java-blocked-publisher");
             Connection consumer = factory.newConnection("java-blocked-consumer")) {
            CountDownLatch blocked = new CountDownLatch(1);
            CountDownLatch unblocked = new CountDownLatch(1);
            List<String> reasons = Collections.synchronizedList(new ArrayList<>());
            publisher.addBlockedListener(new BlockedListener() {
                public void handleBlocked(String reason) { reasons.add(reason); blocked.countDown(); }
                public void handleUnblocked() { unblocked.countDown(); }
            });
            Channel consuming = consumer.createChannel();
            String queue = consuming.queueDeclare().getQueue();
            BlockingQueue<String> received = new LinkedBlockingQueue<>();
            consuming.basicConsume(queue, true, (tag, delivery) -> received.add(text(delivery.getBody())), tag -> { });
            Channel publishing = publisher.createChannel();

            event("ready");  // the test raises a memory alarm
            publishing.basicPublish("", queue, null, "held".getBytes(StandardCharsets.UTF_8));
            await(blocked, "connection.blocked");
            Thread.sleep(300);
            report.put("reasons", new ArrayList<>(reasons));
            report.put("deliveredWhileBlocked", received.size());
            event("blocked");  // the test clears the alarm
            await(unblocked, "connection.unblocked");
            String body = received.poll(WAIT_MS, TimeUnit.MILLISECONDS);
            report.put("unblocked", true);
            report.put("receivedAfter", body);
            report.put("publisherOpen", publisher.isOpen());
        }
    }

    // ---- automatic recovery after a broker restart (interactive)

    static void restart(String url, Map<String, Object> report) throws Exception {
        ConnectionFactory factory = factory(url);
        factory.setAutomaticRecoveryEnabled(true);
        factory.setTopologyRecoveryEnabled(true);
        factory.setNetworkRecoveryInterval(250);
        try (Connection connection = factory.newConnection("java-recovery")) {
            CountDownLatch started = new CountDownLatch(1);
            CountDownLatch recovered = new CountDownLatch(1);
            ((Recoverable) connection).addRecoveryListener(new RecoveryListener() {
                public void handleRecovery(Recoverable recoverable) { recovered.countDown(); }
                public void handleRecoveryStarted(Recoverable recoverable) { started.countDown(); }
            });
            List<Map<String, Object>> shutdowns = Collections.synchronizedList(new ArrayList<>());
            connection.addShutdownListener(cause -> {
                Map<String, Object> seen = new LinkedHashMap<>();
                seen.put("initiatedByApplication", cause.isInitiatedByApplication());
                if (cause.getReason() instanceof AMQP.Connection.Close) {
                    AMQP.Connection.Close close = (AMQP.Connection.Close) cause.getReason();
                    seen.put("replyCode", close.getReplyCode());
                    seen.put("replyText", close.getReplyText());
                }
                shutdowns.add(seen);
            });
            Channel channel = connection.createChannel();
            channel.basicQos(5);
            String queue = "java-recovery-" + TOKEN;
            String key = "recovery." + TOKEN;
            channel.queueDeclare(queue, false, false, false, null);  // not durable: the restart loses it
            channel.queueBind(queue, "amq.topic", key);
            BlockingQueue<String> received = new LinkedBlockingQueue<>();
            List<String> consumerTags = Collections.synchronizedList(new ArrayList<>());
            channel.basicConsume(queue, false, (tag, delivery) -> {
                consumerTags.add(tag);
                received.add(text(delivery.getBody()));
                channel.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
            }, tag -> { });
            channel.basicPublish("amq.topic", key, null, "before".getBytes(StandardCharsets.UTF_8));
            String before = received.poll(WAIT_MS, TimeUnit.MILLISECONDS);

            event("ready");  // the test restarts the broker
            await(recovered, "automatic recovery");
            report.put("recoveryStarted", started.getCount() == 0);
            report.put("recovered", true);
            // The same Channel object, the queue re-declared, the binding and consumer restored.
            channel.basicPublish("amq.topic", key, null, "after".getBytes(StandardCharsets.UTF_8));
            String after = received.poll(WAIT_MS, TimeUnit.MILLISECONDS);
            report.put("shutdowns", new ArrayList<>(shutdowns));
            report.put("received", java.util.Arrays.asList(before, after));
            report.put("consumerTags", new ArrayList<>(new TreeSet<>(consumerTags)));
            report.put("channelOpen", channel.isOpen());
            report.put("messageCount", channel.queueDeclarePassive(queue).getMessageCount());
            channel.queueDelete(queue);
        }
    }

    // ---- helpers

    static void publishConfirmed(Connection connection, String queue, int count) throws Exception {
        Channel channel = connection.createChannel();
        channel.confirmSelect();
        for (int i = 0; i < count; i++) {
            channel.basicPublish("", queue, null, String.valueOf(i).getBytes(StandardCharsets.UTF_8));
        }
        channel.waitForConfirmsOrDie(WAIT_MS);
        channel.close();
    }

    static AMQP.BasicProperties props(String messageId) {
        return new AMQP.BasicProperties.Builder().messageId(messageId).contentType("application/octet-stream").build();
    }

    static GetResponse poll(Channel channel, String queue) throws Exception {
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (System.currentTimeMillis() < deadline) {
            GetResponse got = channel.basicGet(queue, true);
            if (got != null) return got;
            Thread.sleep(20);
        }
        throw new AssertionError("nothing arrived in " + queue);
    }

    static Delivery take(BlockingQueue<Delivery> arrived) throws InterruptedException {
        Delivery delivery = arrived.poll(WAIT_MS, TimeUnit.MILLISECONDS);
        if (delivery == null) throw new AssertionError("no delivery within " + WAIT_MS + " ms");
        return delivery;
    }

    static void await(CountDownLatch latch, String what) throws InterruptedException {
        if (!latch.await(WAIT_MS * 2, TimeUnit.MILLISECONDS)) throw new AssertionError("no " + what);
    }

    // Tells the test where the scenario is, then waits for its line on stdin.
    static void event(String name) throws IOException {
        System.out.println("{\"event\": " + json(name) + "}");
        System.out.flush();
        if (STDIN.readLine() == null) throw new IOException("the test closed stdin");
    }

    static List<Long> sorted(List<Long> values) {
        synchronized (values) {
            List<Long> copy = new ArrayList<>(values);
            Collections.sort(copy);
            return copy;
        }
    }

    static String text(byte[] body) {
        return new String(body, StandardCharsets.UTF_8);
    }

    // Server property values are LongStrings; make tables plain maps of strings and booleans.
    @SuppressWarnings("unchecked")
    static Object stringify(Object value) {
        if (value instanceof Map) {
            Map<String, Object> copy = new TreeMap<>();
            for (Map.Entry<String, Object> entry : ((Map<String, Object>) value).entrySet()) {
                copy.put(entry.getKey(), stringify(entry.getValue()));
            }
            return copy;
        }
        if (value instanceof Boolean || value instanceof Number || value == null) return value;
        return value.toString();
    }

    static String json(Object value) {
        if (value == null) return "null";
        if (value instanceof Boolean || value instanceof Number) return value.toString();
        if (value instanceof Map) {
            StringBuilder out = new StringBuilder("{");
            Iterator<? extends Map.Entry<?, ?>> entries = ((Map<?, ?>) value).entrySet().iterator();
            while (entries.hasNext()) {
                Map.Entry<?, ?> entry = entries.next();
                out.append(json(String.valueOf(entry.getKey()))).append(": ").append(json(entry.getValue()));
                if (entries.hasNext()) out.append(", ");
            }
            return out.append("}").toString();
        }
        if (value instanceof Collection || value instanceof Object[]) {
            Collection<?> items = value instanceof Object[] ? java.util.Arrays.asList((Object[]) value) : (Collection<?>) value;
            StringBuilder out = new StringBuilder("[");
            Iterator<?> each = items.iterator();
            while (each.hasNext()) {
                out.append(json(each.next()));
                if (each.hasNext()) out.append(", ");
            }
            return out.append("]").toString();
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            if (c == '"' || c == '\\') out.append('\\').append(c);
            else if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
            else out.append(c);
        }
        return out.append('"').toString();
    }
}
