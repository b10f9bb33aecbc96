// The RabbitMQ .NET client that Mono ships (Debian's libmono-rabbitmq4.0-cil, RabbitMQ.Client
// 4.0.0.0, the 1.x-era API) against a broker, one scenario per run:
//
//     mono Scenarios.exe <scenario> <url> [ca.pem]
//
// Each scenario prints what an application would notice as one JSON object on the last line of
// stdout ({"ok": true, ...}); interop_tests/test_client_dotnet.py asserts on it. The interactive
// scenarios (blocked, restart) first print {"event": ...} lines and wait for a line on stdin
// while the test changes the broker (raises an alarm, restarts it).
//
// This client speaks AMQP 0-8 unless told otherwise (Protocols.DefaultProtocol); every scenario
// but connect_default_protocol speaks the protocol SCENARIO_PROTOCOL names (AMQP_0_8, or AMQP_0_9,
// which a 0-9-1 broker answers as 0-9-1; AMQP_0_9 without it). It has no publisher confirms
// (transactions instead), no connection.blocked and no automatic recovery.

using System;
using System.Collections;
using System.Collections.Generic;
using System.Net.Security;
using System.Security.Authentication;
using System.Text;
using System.Threading;
using RabbitMQ.Client;
using RabbitMQ.Client.Events;
using RabbitMQ.Client.Exceptions;

public static class Scenarios
{
    const int WaitMs = 10000;
    static readonly string Token = Guid.NewGuid().ToString("N").Substring(0, 8);

    public static int Main(string[] args)
    {
        var report = new SortedDictionary<string, object>();
        int status = 0;
        try
        {
            string url = args[1];
            switch (args[0])
            {
                case "connect": Connect(url, report, ScenarioProtocol()); break;
                case "connect_default_protocol": ConnectDefaultProtocol(url, report); break;
                case "tx_publish": TxPublish(url, report); break;
                case "prefetch": Prefetch(url, report); break;
                case "reject_requeue": RejectRequeue(url, report); break;
                case "channel_error": ChannelError(url, report); break;
                case "heartbeats": Heartbeats(url, report); break;
                case "large_message": LargeMessage(url, report); break;
                case "tls": Tls(url, report); break;
                case "blocked": Blocked(url, report); break;
                case "restart": Restart(url, report); break;
                default: throw new ArgumentException("unknown scenario " + args[0]);
            }
            report["ok"] = true;
        }
        catch (Exception error)
        {
            report["ok"] = false;
            report["error"] = error.ToString();
            status = 1;
        }
        Console.WriteLine(Json(report));
        Console.Out.Flush();
        Environment.Exit(status);  // the client's threads may still run
        return status;
    }

    // amqp://user:password@host:port/vhost, as the newer clients take it (this one predates URIs).
    static ConnectionFactory Factory(string url)
    {
        var uri = new Uri(url);
        var factory = new ConnectionFactory();
        factory.Protocol = ScenarioProtocol();
        factory.HostName = uri.Host;
        factory.Port = uri.Port;
        string[] credentials = Uri.UnescapeDataString(uri.UserInfo).Split(new[] { ':' }, 2);
        factory.UserName = credentials[0];
        factory.Password = credentials[1];
        string vhost = Uri.UnescapeDataString(uri.AbsolutePath.TrimStart('/'));
        factory.VirtualHost = vhost == "" ? "/" : vhost;
        return factory;
    }

    // The protocol every scenario but connect_default_protocol speaks: the one SCENARIO_PROTOCOL
    // names (Protocols.Lookup: AMQP_0_8, AMQP_0_9), AMQP 0-9 without it.
    static IProtocol ScenarioProtocol()
    {
        string name = Environment.GetEnvironmentVariable("SCENARIO_PROTOCOL");
        return string.IsNullOrEmpty(name) ? Protocols.AMQP_0_9 : Protocols.Lookup(name);
    }

    // ---- connect: the handshake as the application sees it

    static void Connect(string url, IDictionary<string, object> report, IProtocol protocol)
    {
        var factory = Factory(url);
        factory.Protocol = protocol;
        using (IConnection connection = factory.CreateConnection())
        {
            report["protocol"] = connection.Protocol.ApiName;
            report["product"] = Plain(connection.ServerProperties["product"]);
            report["serverCapabilities"] = Plain(connection.ServerProperties["capabilities"]);
            report["clientProperties"] = Plain(connection.ClientProperties);
            report["frameMax"] = connection.FrameMax;
            report["channelMax"] = connection.ChannelMax;
            report["heartbeat"] = connection.Heartbeat;
            IModel model = connection.CreateModel();
            string queue = model.QueueDeclare();
            report["queue"] = queue;
            model.BasicPublish("", queue, null, Encoding.UTF8.GetBytes("hello"));
            report["body"] = Encoding.UTF8.GetString(Poll(model, queue).Body);
            connection.Close();
        }
    }

    // The client's default, AMQP 0-8 (header AMQP 1 1 8 0). A broker that refuses it leaves this
    // client waiting (it never gives up by itself), hence the thread and its deadline.
    static void ConnectDefaultProtocol(string url, IDictionary<string, object> report)
    {
        report["defaultProtocol"] = Protocols.DefaultProtocol.ApiName;
        var result = new SortedDictionary<string, object>();
        Exception failure = null;
        var attempt = new Thread(() =>
        {
            try { Connect(url, result, Protocols.DefaultProtocol); }
            catch (Exception error) { failure = error; }
        });
        attempt.IsBackground = true;
        attempt.Start();
        bool finished = attempt.Join(5000);
        report["connected"] = finished && failure == null;
        report["hung"] = !finished;
        if (failure != null) report["failure"] = failure.GetType().Name + ": " + failure.Message;
        lock (result) foreach (var entry in result) report[entry.Key] = entry.Value;
    }

    // ---- transactions: the client's way to know the broker has the messages (it has no confirms)

    static void TxPublish(string url, IDictionary<string, object> report)
    {
        using (IConnection connection = Factory(url).CreateConnection())
        {
            IModel model = connection.CreateModel();
            string queue = model.QueueDeclare();
            var returns = new List<object>();
            model.BasicReturn += (IModel sender, BasicReturnEventArgs returned) =>
            {
                lock (returns) returns.Add(new SortedDictionary<string, object> {
                    { "replyCode", (int)returned.ReplyCode }, { "replyText", returned.ReplyText },
                    { "routingKey", returned.RoutingKey }, { "body", Encoding.UTF8.GetString(returned.Body) } });
            };
            model.TxSelect();
            for (int i = 0; i < 10; i++) model.BasicPublish("", queue, null, Encoding.UTF8.GetBytes("committed " + i));
            model.BasicPublish("", "no-such-queue-" + Token, true, false, null, Encoding.UTF8.GetBytes("unroutable"));
            model.TxCommit();
            report["afterCommit"] = MessageCount(connection, queue);
            for (int i = 0; i < 5; i++) model.BasicPublish("", queue, null, Encoding.UTF8.GetBytes("rolled back " + i));
            model.TxRollback();
            report["afterRollback"] = MessageCount(connection, queue);
            Thread.Sleep(200);
            lock (returns) report["returns"] = new List<object>(returns);
            connection.Close();
        }
    }

    // ---- prefetch: a manual-ack consumer holds at most its prefetch, then gets everything in order

    static void Prefetch(string url, IDictionary<string, object> report)
    {
        const int prefetch = 10, count = 50;
        using (IConnection connection = Factory(url).CreateConnection())
        {
            IModel model = connection.CreateModel();
            string queue = model.QueueDeclare();
            PublishCommitted(connection, queue, count);
            model.BasicQos(0, prefetch, false);
            var consumer = new QueueingBasicConsumer(model);
            model.BasicConsume(queue, false, null, consumer);
            var bodies = new List<object>();
            BasicDeliverEventArgs last = null;
            for (int i = 0; i < prefetch; i++)
            {
                last = Take(consumer);
                bodies.Add(Encoding.UTF8.GetString(last.Body));
            }
            Thread.Sleep(300);  // a broker ignoring the prefetch would have sent more by now
            object extra;
            report["heldUnacked"] = bodies.Count + (consumer.Queue.Dequeue(0, out extra) ? 1 : 0);
            if (extra != null) bodies.Add(Encoding.UTF8.GetString(((BasicDeliverEventArgs)extra).Body));
            model.BasicAck(last.DeliveryTag, true);  // the first ten at once
            while (bodies.Count < count)
            {
                BasicDeliverEventArgs delivery = Take(consumer);
                bodies.Add(Encoding.UTF8.GetString(delivery.Body));
                model.BasicAck(delivery.DeliveryTag, false);
            }
            report["bodies"] = bodies;
            report["messageCount"] = MessageCount(connection, queue);
            connection.Close();
        }
    }

    // ---- reject and requeue: the rejected message comes back first, marked redelivered

    static void RejectRequeue(string url, IDictionary<string, object> report)
    {
        using (IConnection connection = Factory(url).CreateConnection())
        {
            IModel model = connection.CreateModel();
            string queue = model.QueueDeclare();
            PublishCommitted(connection, queue, 3);  // bodies "0", "1", "2"
            model.BasicQos(0, 1, false);
            var consumer = new QueueingBasicConsumer(model);
            model.BasicConsume(queue, false, null, consumer);
            var seen = new List<object>();
            while (seen.Count < 4)
            {
                BasicDeliverEventArgs delivery = Take(consumer);
                string body = Encoding.UTF8.GetString(delivery.Body);
                seen.Add(new SortedDictionary<string, object> { { "body", body }, { "redelivered", delivery.Redelivered } });
                if (body == "0" && !delivery.Redelivered) model.BasicReject(delivery.DeliveryTag, true);
                else if (body == "2") model.BasicReject(delivery.DeliveryTag, false);
                else model.BasicAck(delivery.DeliveryTag, false);
            }
            object more;
            if (consumer.Queue.Dequeue(200, out more)) seen.Add("unexpected " + Encoding.UTF8.GetString(((BasicDeliverEventArgs)more).Body));
            report["deliveries"] = seen;
            report["messageCount"] = MessageCount(connection, queue);
            connection.Close();
        }
    }

    // ---- a channel error closes the channel only; the application carries on

    static void ChannelError(string url, IDictionary<string, object> report)
    {
        using (IConnection connection = Factory(url).CreateConnection())
        {
            string missing = "dotnet-missing-" + Token;
            report["missing"] = missing;
            IModel model = connection.CreateModel();
            report["notFound"] = ChannelClose(() => model.QueueDeclare(missing, true, false, false, false, false, null));
            report["channelOpenAfter"] = model.IsOpen;
            report["connectionOpenAfter"] = connection.IsOpen;

            IModel second = connection.CreateModel();
            string queue = "dotnet-plain-" + Token;
            second.QueueDeclare(queue, false, false, false, true, false, null);
            report["queue"] = queue;
            report["inequivalent"] = ChannelClose(() => second.QueueDeclare(queue, false, true, false, true, false, null));

            IModel third = connection.CreateModel();
            third.BasicPublish("", queue, null, Encoding.UTF8.GetBytes("still here"));
            report["bodyAfter"] = Encoding.UTF8.GetString(Poll(third, queue).Body);
            third.QueueDelete(queue, false, false, false);
            connection.Close();
        }
    }

    static IDictionary<string, object> ChannelClose(Action call)
    {
        try
        {
            call();
        }
        catch (OperationInterruptedException error)
        {
            ShutdownEventArgs reason = error.ShutdownReason;
            return new SortedDictionary<string, object> {
                { "replyCode", (int)reason.ReplyCode }, { "replyText", reason.ReplyText },
                { "classId", (int)reason.ClassId }, { "methodId", (int)reason.MethodId },
                { "initiator", reason.Initiator.ToString() } };
        }
        throw new Exception("no channel error");
    }

    // ---- heartbeats: a 1 s heartbeat keeps an idle connection open

    static void Heartbeats(string url, IDictionary<string, object> report)
    {
        var factory = Factory(url);
        factory.RequestedHeartbeat = 1;
        var shutdowns = new List<object>();
        using (IConnection connection = factory.CreateConnection())
        {
            connection.ConnectionShutdown += (IConnection sender, ShutdownEventArgs reason) =>
            {
                lock (shutdowns) shutdowns.Add(reason.ToString());
            };
            report["heartbeat"] = connection.Heartbeat;
            Thread.Sleep(4000);  // the broker calls a client dead after two silent intervals
            report["openAfterIdle"] = connection.IsOpen;
            lock (shutdowns) report["shutdownsWhileIdle"] = new List<object>(shutdowns);
            IModel model = connection.CreateModel();
            string queue = model.QueueDeclare();
            model.BasicPublish("", queue, null, Encoding.UTF8.GetBytes("after the idle time"));
            report["bodyAfterIdle"] = Encoding.UTF8.GetString(Poll(model, queue).Body);
            connection.Close();
        }
    }

    // ---- messages larger than a frame (frame_max 4096): bodies around one and two frames' payload,
    // and up to 1 MiB + 1 (client_expectations.large_message_sizes), each got back intact

    static void LargeMessage(string url, IDictionary<string, object> report)
    {
        var factory = Factory(url);
        factory.RequestedFrameMax = 4096;
        using (IConnection connection = factory.CreateConnection())
        {
            report["frameMax"] = connection.FrameMax;
            int payload = (int)connection.FrameMax - 8;
            int[] sizes = { 0, 1, payload - 1, payload, payload + 1, 2 * payload, 2 * payload + 1, 100000,
                            1 << 20, (1 << 20) + 1 };
            IModel model = connection.CreateModel();
            string queue = model.QueueDeclare();
            foreach (int size in sizes) model.BasicPublish("", queue, null, Pattern(size));
            var consumer = new QueueingBasicConsumer(model);
            model.BasicConsume(queue, false, null, consumer);
            var bodies = new List<object>();
            foreach (int _ in sizes)
            {
                BasicDeliverEventArgs delivery = Take(consumer);
                byte[] body = delivery.Body;
                bodies.Add(new SortedDictionary<string, object> {
                    { "size", body.Length }, { "intact", Equal(body, Pattern(body.Length)) } });
                model.BasicAck(delivery.DeliveryTag, false);
            }
            report["bodies"] = bodies;
            connection.Close();
        }
    }

    // A body of `size` bytes, byte i (i * 31 + 7) % 251, as in the other languages' scenarios.
    static byte[] Pattern(int size)
    {
        var body = new byte[size];
        for (int i = 0; i < size; i++) body[i] = (byte)((i * 31L + 7) % 251);
        return body;
    }

    static bool Equal(byte[] a, byte[] b)
    {
        if (a.Length != b.Length) return false;
        for (int i = 0; i < a.Length; i++) if (a[i] != b[i]) return false;
        return true;
    }

    // ---- TLS 1.2. The client checks the certificate against Mono's own trust store, which does
    // not hold the test CA: the chain error is accepted, the host name is still checked.

    static void Tls(string url, IDictionary<string, object> report)
    {
        var factory = Factory(url);
        var ssl = new SslOption("localhost", "", true);  // server name, no client certificate, enabled
        ssl.Version = SslProtocols.Tls12;  // its default is SSL 3
        ssl.AcceptablePolicyErrors = SslPolicyErrors.RemoteCertificateChainErrors;
        // CreateConnection() ignores factory.Ssl in this version (its endpoint is rebuilt from host,
        // port and protocol alone), so connect as it does inside, with an endpoint that has TLS on.
        IProtocol protocol = factory.Protocol;
        var endpoint = new AmqpTcpEndpoint(protocol, factory.HostName, factory.Port, ssl);
        using (IConnection connection = protocol.CreateConnection(factory, false, protocol.CreateFrameHandler(endpoint)))
        {
            IModel model = connection.CreateModel();
            string queue = model.QueueDeclare();
            model.BasicPublish("", queue, null, Encoding.UTF8.GetBytes("over tls"));
            report["body"] = Encoding.UTF8.GetString(Poll(model, queue).Body);
            connection.Close();
        }
    }

    // ---- a memory alarm (interactive). The client never announces connection.blocked, so the
    // broker must not send it: the publish is held, the connection stays open.

    static void Blocked(string url, IDictionary<string, object> report)
    {
        var factory = Factory(url);
        using (IConnection publisher = factory.CreateConnection())
        using (IConnection consumer = factory.CreateConnection())
        {
            var shutdowns = new List<object>();
            publisher.ConnectionShutdown += (IConnection sender, ShutdownEventArgs reason) =>
            {
                lock (shutdowns) shutdowns.Add(reason.ToString());
            };
            IModel consuming = consumer.CreateModel();
            string queue = consuming.QueueDeclare();
            var deliveries = new QueueingBasicConsumer(consuming);
            consuming.BasicConsume(queue, true, null, deliveries);
            IModel publishing = publisher.CreateModel();

            Event("ready");  // the test raises a memory alarm
            publishing.BasicPublish("", queue, null, Encoding.UTF8.GetBytes("held"));
            object early;
            report["deliveredWhileBlocked"] = deliveries.Queue.Dequeue(1500, out early) ? 1 : 0;
            report["publisherOpenWhileBlocked"] = publisher.IsOpen;
            Event("blocked");  // the test clears the alarm
            object late = early;
            if (late == null && !deliveries.Queue.Dequeue(WaitMs, out late)) throw new Exception("the held message never came");
            report["receivedAfter"] = Encoding.UTF8.GetString(((BasicDeliverEventArgs)late).Body);
            report["publisherOpen"] = publisher.IsOpen;
            lock (shutdowns) report["publisherShutdowns"] = new List<object>(shutdowns);
            publisher.Close();
            consumer.Close();
        }
    }

    // ---- a broker restart (interactive): the client reports the server's close through
    // ConnectionShutdown; it has no recovery, so the application connects again.

    static void Restart(string url, IDictionary<string, object> report)
    {
        var factory = Factory(url);
        IConnection connection = factory.CreateConnection();
        var closed = new ManualResetEvent(false);
        connection.ConnectionShutdown += (IConnection sender, ShutdownEventArgs reason) =>
        {
            lock (report)
            {
                report["shutdown"] = new SortedDictionary<string, object> {
                    { "initiator", reason.Initiator.ToString() }, { "replyCode", (int)reason.ReplyCode },
                    { "replyText", reason.ReplyText } };
            }
            closed.Set();
        };
        IModel model = connection.CreateModel();
        string queue = "dotnet-reconnect-" + Token;
        model.QueueDeclare(queue, false, true, false, false, false, null);  // durable
        IBasicProperties persistent = model.CreateBasicProperties();
        persistent.DeliveryMode = 2;
        model.TxSelect();
        model.BasicPublish("", queue, persistent, Encoding.UTF8.GetBytes("kept"));
        model.TxCommit();

        Event("ready");  // the test restarts the broker
        if (!closed.WaitOne(2 * WaitMs)) throw new Exception("no ConnectionShutdown after the restart");
        lock (report) report["openAfter"] = connection.IsOpen;
        DateTime deadline = DateTime.UtcNow.AddMilliseconds(2 * WaitMs);
        while (true)
        {
            try { connection = factory.CreateConnection(); break; }
            catch (BrokerUnreachableException) { if (DateTime.UtcNow > deadline) throw; }
            Thread.Sleep(250);
        }
        using (connection)
        {
            lock (report) report["reconnected"] = true;
            model = connection.CreateModel();
            BasicGetResult got = model.BasicGet(queue, true);
            lock (report)
            {
                report["bodyAfter"] = got == null ? null : Encoding.UTF8.GetString(got.Body);
                report["redeliveredAfter"] = got != null && got.Redelivered;
            }
            model.QueueDelete(queue, false, false, false);
            connection.Close();
        }
    }

    // ---- helpers

    static void PublishCommitted(IConnection connection, string queue, int count)
    {
        IModel model = connection.CreateModel();
        model.TxSelect();
        for (int i = 0; i < count; i++) model.BasicPublish("", queue, null, Encoding.UTF8.GetBytes(i.ToString()));
        model.TxCommit();
        model.Close();
    }

    // The 1.x API gives queue.declare's name only, not its message count: get one message on a
    // channel of its own (its message_count is the rest) and close that channel to requeue it.
    static uint MessageCount(IConnection connection, string queue)
    {
        IModel model = connection.CreateModel();
        BasicGetResult got = model.BasicGet(queue, false);
        model.Close();
        return got == null ? 0 : got.MessageCount + 1;
    }

    static BasicGetResult Poll(IModel model, string queue)
    {
        DateTime deadline = DateTime.UtcNow.AddMilliseconds(WaitMs);
        while (DateTime.UtcNow < deadline)
        {
            BasicGetResult got = model.BasicGet(queue, true);
            if (got != null) return got;
            Thread.Sleep(20);
        }
        throw new Exception("nothing arrived in " + queue);
    }

    static BasicDeliverEventArgs Take(QueueingBasicConsumer consumer)
    {
        object delivery;
        if (!consumer.Queue.Dequeue(WaitMs, out delivery)) throw new Exception("no delivery within " + WaitMs + " ms");
        return (BasicDeliverEventArgs)delivery;
    }

    // Tells the test where the scenario is, then waits for its line on stdin.
    static void Event(string name)
    {
        Console.WriteLine("{\"event\": " + Json(name) + "}");
        Console.Out.Flush();
        if (Console.In.ReadLine() == null) throw new Exception("the test closed stdin");
    }

    // Tables come back as Hashtables of byte[] (long strings), bools and numbers.
    static object Plain(object value)
    {
        if (value is byte[]) return Encoding.UTF8.GetString((byte[])value);
        if (value is IDictionary)
        {
            var copy = new SortedDictionary<string, object>(StringComparer.Ordinal);
            foreach (DictionaryEntry entry in (IDictionary)value) copy[entry.Key.ToString()] = Plain(entry.Value);
            return copy;
        }
        return value;
    }

    static string Json(object value)
    {
        if (value == null) return "null";
        if (value is bool) return (bool)value ? "true" : "false";
        if (value is string)
        {
            var text = new StringBuilder("\"");
            foreach (char c in (string)value)
            {
                if (c == '"' || c == '\\') text.Append('\\').Append(c);
                else if (c < 0x20) text.AppendFormat("\\u{0:x4}", (int)c);
                else text.Append(c);
            }
            return text.Append('"').ToString();
        }
        if (value is IDictionary)
        {
            var parts = new List<string>();
            foreach (DictionaryEntry entry in (IDictionary)value) parts.Add(Json(entry.Key.ToString()) + ": " + Json(entry.Value));
            return "{" + string.Join(", ", parts) + "}";
        }
        if (value is IEnumerable)
        {
            var parts = new List<string>();
            foreach (object item in (IEnumerable)value) parts.Add(Json(item));
            return "[" + string.Join(", ", parts) + "]";
        }
        if (value is IFormattable) return ((IFormattable)value).ToString(null, System.Globalization.CultureInfo.InvariantCulture);
        return Json(value.ToString());
    }
}
