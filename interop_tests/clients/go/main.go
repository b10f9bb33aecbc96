// RabbitMQ's Go client (Debian's golang-github-rabbitmq-amqp091-go-dev) against a broker, one
// scenario per run:
//
//	amqp-scenarios <scenario> <url> [ca.pem]
//
// Each scenario prints what an application would notice as one JSON object on the last line of
// stdout ({"ok": true, ...}); interop_tests/test_client_go.py asserts on it. The interactive
// scenarios (blocked, restart) first print {"event": ...} lines and wait for a line on stdin
// while the test changes the broker (raises an alarm, restarts it).
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const wait = 10 * time.Second

type report map[string]any

var (
	token = randomToken()
	stdin = bufio.NewReader(os.Stdin)
)

func main() {
	out := report{}
	scenarios := map[string]func(string, []string, report) error{
		"connect":        connect,
		"confirms":       confirms,
		"prefetch":       prefetch,
		"reject_requeue": rejectRequeue,
		"channel_error":  channelError,
		"heartbeats":     heartbeats,
		"large_message":  largeMessage,
		"tls":            tlsRoundTrip,
		"blocked":        blocked,
		"restart":        restart,
	}
	status := 0
	if len(os.Args) < 3 {
		out["ok"], out["error"] = false, "usage: amqp-scenarios <scenario> <url> [args]"
		status = 2
	} else if run, known := scenarios[os.Args[1]]; !known {
		out["ok"], out["error"] = false, "unknown scenario "+os.Args[1]
		status = 2
	} else if err := run(os.Args[2], os.Args[3:], out); err != nil {
		out["ok"], out["error"] = false, err.Error()
		status = 1
	} else {
		out["ok"] = true
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
	os.Exit(status)
}

// ---- connect: the handshake as the application sees it

func connect(url string, _ []string, out report) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	out["product"] = conn.Properties["product"]
	out["serverCapabilities"] = conn.Properties["capabilities"]
	out["version"] = fmt.Sprintf("%d-%d", conn.Major, conn.Minor)
	out["frameMax"] = conn.Config.FrameSize
	out["channelMax"] = conn.Config.ChannelMax
	out["heartbeat"] = conn.Config.Heartbeat.Seconds()
	queue, body, err := roundTrip(conn, "hello")
	out["queue"], out["body"] = queue, body
	return err
}

// ---- confirms: every publish acked, an unroutable mandatory one returned before its ack

func confirms(url string, _ []string, out report) error {
	conn, ch, q, err := openWithQueue(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirmations := ch.NotifyPublish(make(chan amqp.Confirmation, 200))
	returns := ch.NotifyReturn(make(chan amqp.Return, 10))
	const count = 100
	for i := 0; i < count; i++ {
		body := []byte(fmt.Sprintf("message %d", i))
		if i%10 == 0 {
			body = make([]byte, 10000)
		}
		if err := ch.Publish("", q.Name, false, false, amqp.Publishing{MessageId: fmt.Sprintf("m%d", i), Body: body}); err != nil {
			return err
		}
	}
	unroutable := ch.GetNextPublishSeqNo()
	if err := ch.Publish("", "no-such-queue-"+token, true, false, amqp.Publishing{Body: []byte("unroutable")}); err != nil {
		return err
	}
	acked, nacked := []uint64{}, []uint64{}
	returnedBeforeAck := false
	for len(acked)+len(nacked) < count+1 {
		select {
		case c := <-confirmations:
			if c.Ack {
				acked = append(acked, c.DeliveryTag)
			} else {
				nacked = append(nacked, c.DeliveryTag)
			}
			if c.DeliveryTag == unroutable {
				returnedBeforeAck = len(returns) == 1
			}
		case <-time.After(wait):
			return fmt.Errorf("only %d of %d confirms", len(acked)+len(nacked), count+1)
		}
	}
	out["acked"], out["nacked"], out["unroutableTag"] = acked, nacked, unroutable
	out["returnedBeforeAck"] = returnedBeforeAck
	select {
	case r := <-returns:
		out["return"] = report{"replyCode": r.ReplyCode, "replyText": r.ReplyText, "routingKey": r.RoutingKey, "body": string(r.Body)}
	case <-time.After(wait):
		return errors.New("no basic.return")
	}
	inspected, err := ch.QueueInspect(q.Name)
	out["messageCount"] = inspected.Messages
	return err
}

// ---- prefetch: a manual-ack consumer holds at most its prefetch, then gets everything in order

func prefetch(url string, _ []string, out report) error {
	const prefetchCount, count = 10, 50
	conn, ch, q, err := openWithQueue(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := publishConfirmed(conn, q.Name, count); err != nil {
		return err
	}
	if err := ch.Qos(prefetchCount, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	bodies := []string{}
	var last amqp.Delivery
	for i := 0; i < prefetchCount; i++ {
		if last, err = take(deliveries); err != nil {
			return err
		}
		bodies = append(bodies, string(last.Body))
	}
	time.Sleep(300 * time.Millisecond) // a broker ignoring the prefetch would have sent more by now
	out["heldUnacked"] = len(bodies) + len(deliveries)
	if err := last.Ack(true); err != nil { // the first ten at once
		return err
	}
	for len(bodies) < count {
		d, err := take(deliveries)
		if err != nil {
			return err
		}
		bodies = append(bodies, string(d.Body))
		if err := d.Ack(false); err != nil {
			return err
		}
	}
	out["bodies"] = bodies
	inspected, err := ch.QueueInspect(q.Name)
	out["messageCount"], out["consumerCount"] = inspected.Messages, inspected.Consumers
	return err
}

// ---- reject and requeue: the rejected message comes back first, marked redelivered

func rejectRequeue(url string, _ []string, out report) error {
	conn, ch, q, err := openWithQueue(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := publishConfirmed(conn, q.Name, 3); err != nil { // bodies "0", "1", "2"
		return err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	seen := []report{}
	for len(seen) < 4 {
		d, err := take(deliveries)
		if err != nil {
			return err
		}
		seen = append(seen, report{"body": string(d.Body), "redelivered": d.Redelivered})
		switch {
		case string(d.Body) == "0" && !d.Redelivered:
			err = d.Reject(true) // back to the queue
		case string(d.Body) == "2":
			err = d.Reject(false) // dropped (no dead-letter exchange)
		default:
			err = d.Ack(false)
		}
		if err != nil {
			return err
		}
	}
	select { // nothing more may come
	case d := <-deliveries:
		seen = append(seen, report{"body": string(d.Body), "redelivered": d.Redelivered})
	case <-time.After(200 * time.Millisecond):
	}
	out["deliveries"] = seen
	inspected, err := ch.QueueInspect(q.Name)
	out["messageCount"] = inspected.Messages
	return err
}

// ---- a channel error closes the channel only; the application carries on

func channelError(url string, _ []string, out report) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	missing := "go-missing-" + token
	out["missing"] = missing
	_, declareErr := ch.QueueDeclarePassive(missing, false, false, false, false, nil)
	out["notFound"] = describe(declareErr)
	select {
	case e := <-closed:
		out["notifyClose"] = describe(e)
	case <-time.After(wait):
		return errors.New("no channel NotifyClose")
	}
	out["channelClosedAfter"] = ch.IsClosed()
	out["connectionClosedAfter"] = conn.IsClosed()

	second, err := conn.Channel()
	if err != nil {
		return err
	}
	queue := "go-plain-" + token
	if _, err := second.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		return err
	}
	out["queue"] = queue
	_, redeclareErr := second.QueueDeclare(queue, true, true, false, false, nil)
	out["inequivalent"] = describe(redeclareErr)

	third, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := third.Publish("", queue, false, false, amqp.Publishing{Body: []byte("still here")}); err != nil {
		return err
	}
	body, err := poll(third, queue)
	out["bodyAfter"] = body
	if err == nil {
		_, err = third.QueueDelete(queue, false, false, false)
	}
	return err
}

// ---- heartbeats: a 1 s heartbeat keeps an idle connection open

func heartbeats(url string, _ []string, out report) error {
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: time.Second, Locale: "en_US"})
	if err != nil {
		return err
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	out["heartbeat"] = conn.Config.Heartbeat.Seconds()
	// The client gives up after three silent intervals (its read deadline); the broker after two.
	select {
	case e := <-closed:
		out["closedWhileIdle"] = describe(e)
		return nil
	case <-time.After(4 * time.Second):
	}
	out["openAfterIdle"] = !conn.IsClosed()
	_, body, err := roundTrip(conn, "after the idle time")
	out["bodyAfterIdle"] = body
	return err
}

// ---- messages larger than a frame (frame_max 4096): bodies around one and two frames' payload,
// and up to 1 MiB + 1 (client_expectations.large_message_sizes), each got back intact

func largeMessage(url string, _ []string, out report) error {
	conn, err := amqp.DialConfig(url, amqp.Config{FrameSize: 4096, Heartbeat: 10 * time.Second, Locale: "en_US"})
	if err != nil {
		return err
	}
	defer conn.Close()
	out["frameMax"] = conn.Config.FrameSize
	payload := conn.Config.FrameSize - 8
	sizes := []int{0, 1, payload - 1, payload, payload + 1, 2 * payload, 2*payload + 1, 100000, 1 << 20, 1<<20 + 1}
	ch, q, err := privateQueue(conn)
	if err != nil {
		return err
	}
	confirmations, err := confirmMode(ch, len(sizes))
	if err != nil {
		return err
	}
	for _, size := range sizes {
		if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: pattern(size)}); err != nil {
			return err
		}
	}
	if err := awaitAcks(confirmations, len(sizes)); err != nil {
		return err
	}
	deliveries, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	bodies := []report{}
	for range sizes {
		d, err := take(deliveries)
		if err != nil {
			return err
		}
		bodies = append(bodies, report{"size": len(d.Body), "intact": bytes.Equal(d.Body, pattern(len(d.Body)))})
		if err := d.Ack(false); err != nil {
			return err
		}
	}
	out["bodies"] = bodies
	return nil
}

// pattern is a body of `size` bytes, byte i (i * 31 + 7) % 251, as in the other languages' scenarios.
func pattern(size int) []byte {
	body := make([]byte, size)
	for i := range body {
		body[i] = byte((i*31 + 7) % 251)
	}
	return body
}

// ---- TLS: amqps with the test CA as the only trusted root, the host name checked

func tlsRoundTrip(url string, args []string, out report) error {
	pem, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return errors.New("no certificate in " + args[0])
	}
	conn, err := amqp.DialTLS(url, &tls.Config{RootCAs: roots, ServerName: "localhost"})
	if err != nil {
		return err
	}
	defer conn.Close()
	state := conn.ConnectionState()
	out["handshakeComplete"] = state.HandshakeComplete
	out["tlsVersion"] = map[uint16]string{tls.VersionTLS12: "TLS 1.2", tls.VersionTLS13: "TLS 1.3"}[state.Version]
	_, body, err := roundTrip(conn, "over tls")
	out["body"] = body
	return err
}

// ---- connection.blocked under a memory alarm (interactive)

func blocked(url string, _ []string, out report) error {
	publisher, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer publisher.Close()
	consumer, consuming, q, err := openWithQueue(url)
	if err != nil {
		return err
	}
	defer consumer.Close()
	blockings := publisher.NotifyBlocked(make(chan amqp.Blocking, 4))
	deliveries, err := consuming.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		return err
	}
	publishing, err := publisher.Channel()
	if err != nil {
		return err
	}

	if err := event("ready"); err != nil { // the test raises a memory alarm
		return err
	}
	if err := publishing.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("held")}); err != nil {
		return err
	}
	first, err := nextBlocking(blockings)
	if err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	out["blocked"] = report{"active": first.Active, "reason": first.Reason}
	out["deliveredWhileBlocked"] = len(deliveries)
	if err := event("blocked"); err != nil { // the test clears the alarm
		return err
	}
	second, err := nextBlocking(blockings)
	if err != nil {
		return err
	}
	out["unblocked"] = report{"active": second.Active, "reason": second.Reason}
	d, err := take(deliveries)
	if err != nil {
		return err
	}
	out["receivedAfter"] = string(d.Body)
	out["publisherOpen"] = !publisher.IsClosed()
	return nil
}

func nextBlocking(blockings chan amqp.Blocking) (amqp.Blocking, error) {
	select {
	case b := <-blockings:
		return b, nil
	case <-time.After(2 * wait):
		return amqp.Blocking{}, errors.New("no connection.blocked/unblocked")
	}
}

// ---- a broker restart (interactive): the client has no automatic recovery; it reports the
// server's close through NotifyClose and the application dials again, as amqp091-go's
// documentation tells it to.

func restart(url string, _ []string, out report) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	queue := "go-reconnect-" + token
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil { // durable
		return err
	}
	confirmations, err := confirmMode(ch, 1)
	if err != nil {
		return err
	}
	if err := ch.Publish("", queue, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("kept")}); err != nil {
		return err
	}
	out["confirmedBefore"] = awaitAcks(confirmations, 1) == nil

	if err := event("ready"); err != nil { // the test restarts the broker
		return err
	}
	select {
	case e := <-closed:
		out["closeError"] = describe(e)
	case <-time.After(2 * wait):
		return errors.New("no NotifyClose after the restart")
	}
	out["closedAfter"] = conn.IsClosed()
	deadline := time.Now().Add(2 * wait)
	attempts := 0
	for {
		attempts++
		if conn, err = amqp.Dial(url); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no reconnect after %d attempts: %w", attempts, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	defer conn.Close()
	out["reconnected"] = true
	if ch, err = conn.Channel(); err != nil {
		return err
	}
	d, ok, err := ch.Get(queue, true)
	if err != nil {
		return err
	}
	if ok {
		out["bodyAfter"] = string(d.Body)
		out["redeliveredAfter"] = d.Redelivered
	}
	_, err = ch.QueueDelete(queue, false, false, false)
	return err
}

// ---- helpers

// openWithQueue dials `url` and declares a private queue on a new channel (privateQueue).
func openWithQueue(url string) (*amqp.Connection, *amqp.Channel, amqp.Queue, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, amqp.Queue{}, err
	}
	ch, q, err := privateQueue(conn)
	if err != nil {
		conn.Close()
	}
	return conn, ch, q, err
}

// privateQueue is a new channel on `conn` and an exclusive, auto-delete, server-named queue.
func privateQueue(conn *amqp.Connection) (*amqp.Channel, amqp.Queue, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, amqp.Queue{}, err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	return ch, q, err
}

// roundTrip publishes `body` to a private queue on `conn` and gets it back: the queue's name and
// the body that came.
func roundTrip(conn *amqp.Connection, body string) (string, string, error) {
	ch, q, err := privateQueue(conn)
	if err != nil {
		return "", "", err
	}
	if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
		return q.Name, "", err
	}
	got, err := poll(ch, q.Name)
	return q.Name, got, err
}

func publishConfirmed(conn *amqp.Connection, queue string, count int) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	confirmations, err := confirmMode(ch, count)
	if err != nil {
		return err
	}
	for i := 0; i < count; i++ {
		if err := ch.Publish("", queue, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))}); err != nil {
			return err
		}
	}
	return awaitAcks(confirmations, count)
}

// confirmMode puts the channel in confirm mode, confirmations arriving on the returned channel.
// (Not PublishWithDeferredConfirm: in amqp091-go 1.5.0 it registers the confirmation after
// sending the publish, so an ack that comes back first is dropped and Wait() never returns;
// rabbitmq/amqp091-go#182.)
func confirmMode(ch *amqp.Channel, capacity int) (chan amqp.Confirmation, error) {
	confirmations := ch.NotifyPublish(make(chan amqp.Confirmation, capacity))
	return confirmations, ch.Confirm(false)
}

func awaitAcks(confirmations chan amqp.Confirmation, count int) error {
	for i := 0; i < count; i++ {
		select {
		case c := <-confirmations:
			if !c.Ack {
				return fmt.Errorf("publish %d nacked", c.DeliveryTag)
			}
		case <-time.After(wait):
			return fmt.Errorf("%d of %d publishes confirmed", i, count)
		}
	}
	return nil
}

func poll(ch *amqp.Channel, queue string) (string, error) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return "", err
		}
		if ok {
			return string(d.Body), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", errors.New("nothing arrived in " + queue)
}

func take(deliveries <-chan amqp.Delivery) (amqp.Delivery, error) {
	select {
	case d, open := <-deliveries:
		if !open {
			return d, errors.New("the delivery channel closed")
		}
		return d, nil
	case <-time.After(wait):
		return amqp.Delivery{}, errors.New("no delivery within 10 s")
	}
}

func describe(err error) report {
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) {
		return report{"error": fmt.Sprint(err)}
	}
	return report{"code": amqpErr.Code, "reason": amqpErr.Reason, "server": amqpErr.Server, "recover": amqpErr.Recover}
}

// event tells the test where the scenario is, then waits for its line on stdin.
func event(name string) error {
	line, _ := json.Marshal(report{"event": name})
	fmt.Println(string(line))
	if _, err := stdin.ReadString('\n'); err != nil {
		return fmt.Errorf("the test closed stdin: %w", err)
	}
	return nil
}

func randomToken() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
