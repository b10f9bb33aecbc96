/* Scenarios of rabbitmq-c (librabbitmq, Debian's librabbitmq-dev) against a broker, for
 * interop_tests/test_client_c.py.
 *
 *     scenarios <scenario> <amqp-url> [ca-file]
 *
 * Each scenario does what an application on rabbitmq-c does and prints, as its last line, one
 * JSON object: {"ok": true, ...what it observed...}, or {"ok": false, "error": "..."}. The
 * interactive ones (blocked, restart) first print {"event": ...} lines and wait for a line on
 * stdin while the test changes the broker (interop_tests/scenario_programs.py). The test
 * asserts on the JSON; nothing here decides what the broker should have answered.
 */

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static amqp_connection_state_t conn;

/* ---- JSON output ---------------------------------------------------------------------- */

static void json_string(const char *text, size_t length) {
  putchar('"');
  for (size_t i = 0; i < length; i++) {
    unsigned char c = (unsigned char)text[i];
    if (c == '"' || c == '\\') {
      printf("\\%c", c);
    } else if (c < 0x20 || c >= 0x7f) {
      printf("\\u%04x", c);
    } else {
      putchar(c);
    }
  }
  putchar('"');
}

static void json_bytes(amqp_bytes_t bytes) { json_string(bytes.bytes, bytes.len); }

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  printf("{\"ok\": false, \"error\": ");
  json_string(message, strlen(message));
  printf("}\n");
  exit(1);
}

/* Tells the test where the scenario is, then waits for its line on stdin. */
static void event(const char *name) {
  printf("{\"event\": \"%s\"}\n", name);
  fflush(stdout);
  char line[64];
  if (fgets(line, sizeof line, stdin) == NULL) fail("the test closed stdin at event %s", name);
}

/* ---- errors as the library reports them ---------------------------------------------- */

/* A server's close (channel or connection) as {"code", "text", "class_id", "method_id"}. */
typedef struct {
  int code;
  char text[512];
  int class_id, method_id;
} close_reason;

static close_reason reason_of(amqp_rpc_reply_t reply) {
  close_reason reason = {0};
  if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
    amqp_channel_close_t *close = reply.reply.decoded;
    reason.code = close->reply_code;
    snprintf(reason.text, sizeof reason.text, "%.*s", (int)close->reply_text.len, (char *)close->reply_text.bytes);
    reason.class_id = close->class_id;
    reason.method_id = close->method_id;
  } else if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
    amqp_connection_close_t *close = reply.reply.decoded;
    reason.code = close->reply_code;
    snprintf(reason.text, sizeof reason.text, "%.*s", (int)close->reply_text.len, (char *)close->reply_text.bytes);
    reason.class_id = close->class_id;
    reason.method_id = close->method_id;
  }
  return reason;
}

static void print_reason(close_reason reason) {
  printf("{\"code\": %d, \"text\": ", reason.code);
  json_string(reason.text, strlen(reason.text));
  printf(", \"class_id\": %d, \"method_id\": %d}", reason.class_id, reason.method_id);
}

static void check(amqp_rpc_reply_t reply, const char *what) {
  switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return;
    case AMQP_RESPONSE_NONE:
      fail("%s: missing RPC reply type", what);
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      fail("%s: %s", what, amqp_error_string2(reply.library_error));
    case AMQP_RESPONSE_SERVER_EXCEPTION: {
      close_reason reason = reason_of(reply);
      fail("%s: server closed with %d %s", what, reason.code, reason.text);
    }
  }
}

static void check_status(int status, const char *what) {
  if (status != AMQP_STATUS_OK) fail("%s: %s", what, amqp_error_string2(status));
}

/* ---- connecting ---------------------------------------------------------------------- */

/* rabbitmq-c announces only authentication_failure_close among the client capabilities; an
 * application that wants connection.blocked notifications adds the capability itself. */
static int announce_blocked = 0;

static amqp_rpc_reply_t login(amqp_connection_state_t state, const char *vhost, int frame_max, int heartbeat,
                              const char *user, const char *password) {
  if (!announce_blocked)
    return amqp_login(state, vhost, 0, frame_max, heartbeat, AMQP_SASL_METHOD_PLAIN, user, password);
  amqp_table_entry_t capability = {amqp_cstring_bytes("connection.blocked"), {AMQP_FIELD_KIND_BOOLEAN, {.boolean = 1}}};
  amqp_table_entry_t property = {amqp_cstring_bytes("capabilities"),
                                 {AMQP_FIELD_KIND_TABLE, {.table = {1, &capability}}}};
  amqp_table_t properties = {1, &property};
  return amqp_login_with_properties(state, vhost, 0, frame_max, heartbeat, &properties, AMQP_SASL_METHOD_PLAIN, user,
                                    password);
}

/* Opens `conn`; 0 when the socket or the login failed and `fatal` is 0 (then `conn` is gone). */
static int try_connect(const char *url, int frame_max, int heartbeat, const char *ca_file, int fatal) {
  struct amqp_connection_info info;
  char *copy = strdup(url);
  amqp_default_connection_info(&info);
  check_status(amqp_parse_url(copy, &info), "parsing the URL");
  conn = amqp_new_connection();
  amqp_socket_t *socket;
  if (info.ssl) {
    socket = amqp_ssl_socket_new(conn);
    if (socket == NULL) fail("creating the TLS socket");
    if (ca_file == NULL) fail("an amqps URL needs a CA file");
    check_status(amqp_ssl_socket_set_cacert(socket, ca_file), "loading the CA file");
    amqp_ssl_socket_set_verify_peer(socket, 1);
    amqp_ssl_socket_set_verify_hostname(socket, 1);
  } else {
    socket = amqp_tcp_socket_new(conn);
    if (socket == NULL) fail("creating the TCP socket");
  }
  int status = amqp_socket_open(socket, info.host, info.port);
  amqp_rpc_reply_t reply = {0};
  if (status == AMQP_STATUS_OK) reply = login(conn, info.vhost, frame_max, heartbeat, info.user, info.password);
  if (fatal) {
    check_status(status, "opening the socket");
    check(reply, "logging in");
  }
  free(copy);
  if (status == AMQP_STATUS_OK && reply.reply_type == AMQP_RESPONSE_NORMAL) return 1;
  amqp_destroy_connection(conn);
  return 0;
}

static void connect_to(const char *url, int frame_max, int heartbeat, const char *ca_file) {
  try_connect(url, frame_max, heartbeat, ca_file, 1);
}

static void open_channel(amqp_channel_t channel) {
  amqp_channel_open(conn, channel);
  check(amqp_get_rpc_reply(conn), "channel.open");
}

static void close_connection(void) {
  check(amqp_connection_close(conn, AMQP_REPLY_SUCCESS), "connection.close");
  amqp_destroy_connection(conn);
}

/* An exclusive server-named queue; the returned name lives as long as the connection. */
static amqp_bytes_t declare_private_queue(amqp_channel_t channel) {
  amqp_queue_declare_ok_t *ok = amqp_queue_declare(conn, channel, amqp_empty_bytes, 0, 0, 1, 1, amqp_empty_table);
  check(amqp_get_rpc_reply(conn), "queue.declare");
  return amqp_bytes_malloc_dup(ok->queue);
}

static uint32_t message_count(amqp_channel_t channel, amqp_bytes_t queue) {
  amqp_queue_declare_ok_t *ok = amqp_queue_declare(conn, channel, queue, 1, 0, 0, 0, amqp_empty_table);
  check(amqp_get_rpc_reply(conn), "passive queue.declare");
  return ok->message_count;
}

static void publish(amqp_channel_t channel, amqp_bytes_t exchange, amqp_bytes_t routing_key, int mandatory,
                    amqp_bytes_t body) {
  amqp_basic_properties_t properties;
  properties._flags = AMQP_BASIC_CONTENT_TYPE_FLAG;
  properties.content_type = amqp_cstring_bytes("text/plain");
  check_status(amqp_basic_publish(conn, channel, exchange, routing_key, mandatory, 0, &properties, body),
               "basic.publish");
}

static void publish_text(amqp_channel_t channel, amqp_bytes_t queue, const char *text) {
  publish(channel, amqp_empty_bytes, queue, 0, amqp_cstring_bytes(text));
}

/* basic.get with an ack; writes the body into `body` ("" and returns 0 when the queue is empty). */
static int get_one(amqp_channel_t channel, amqp_bytes_t queue, char *body, size_t size) {
  amqp_rpc_reply_t reply = amqp_basic_get(conn, channel, queue, 0);
  check(reply, "basic.get");
  body[0] = '\0';
  if (reply.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) return 0;
  uint64_t tag = ((amqp_basic_get_ok_t *)reply.reply.decoded)->delivery_tag;
  amqp_message_t message;
  check(amqp_read_message(conn, channel, &message, 0), "reading the message of basic.get-ok");
  snprintf(body, size, "%.*s", (int)message.body.len, (char *)message.body.bytes);
  amqp_destroy_message(&message);
  check_status(amqp_basic_ack(conn, channel, tag, 0), "basic.ack");
  return 1;
}

static amqp_rpc_reply_t consume_within(amqp_envelope_t *envelope, long milliseconds) {
  struct timeval timeout = {milliseconds / 1000, (milliseconds % 1000) * 1000};
  amqp_maybe_release_buffers(conn);
  return amqp_consume_message(conn, envelope, &timeout, 0);
}

static int timed_out(amqp_rpc_reply_t reply) {
  return reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && reply.library_error == AMQP_STATUS_TIMEOUT;
}

/* ---- scenarios ----------------------------------------------------------------------- */

static void scenario_connect(const char *url) {
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL);
  amqp_table_t *properties = amqp_get_server_properties(conn);
  printf("{\"ok\": true, \"channel_max\": %d, \"frame_max\": %d, \"heartbeat\": %d, \"capabilities\": {",
         amqp_get_channel_max(conn), amqp_get_frame_max(conn), amqp_get_heartbeat(conn));
  for (int i = 0; i < properties->num_entries; i++) {
    amqp_table_entry_t *entry = &properties->entries[i];
    if (entry->value.kind != AMQP_FIELD_KIND_TABLE || strncmp(entry->key.bytes, "capabilities", entry->key.len) != 0)
      continue;
    amqp_table_t *capabilities = &entry->value.value.table;
    for (int j = 0; j < capabilities->num_entries; j++) {
      amqp_table_entry_t *capability = &capabilities->entries[j];
      printf("%s", j ? ", " : "");
      json_bytes(capability->key);
      printf(": %s", capability->value.kind == AMQP_FIELD_KIND_BOOLEAN && capability->value.value.boolean ? "true"
                                                                                                          : "false");
    }
  }
  printf("}, \"server_properties\": [");
  for (int i = 0; i < properties->num_entries; i++) {
    printf("%s", i ? ", " : "");
    json_bytes(properties->entries[i].key);
  }
  printf("]}\n");
  close_connection();
}

#define CONFIRMED 100

/* confirm.select, 100 publishes, then a mandatory publish nobody can take: its basic.return must
 * come before its basic.ack. */
static void scenario_confirms(const char *url) {
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL);
  open_channel(1);
  amqp_confirm_select(conn, 1);
  check(amqp_get_rpc_reply(conn), "confirm.select");
  amqp_bytes_t queue = declare_private_queue(1);
  char body[32];
  for (int i = 0; i < CONFIRMED; i++) {
    snprintf(body, sizeof body, "message %d", i);
    publish_text(1, queue, body);
  }
  publish(1, amqp_empty_bytes, amqp_cstring_bytes("no-such-queue-anywhere"), 1, amqp_cstring_bytes("unroutable"));

  /* Confirms may come out of order (the unroutable message's needs no queue) and one ack with
   * `multiple` confirms every outstanding tag up to its own. */
  int confirmed[CONFIRMED + 2] = {0}; /* per tag: 0 outstanding, 1 acked, 2 nacked */
  int outstanding = CONFIRMED + 1, returned_code = 0, return_before_ack = 0;
  char returned_text[256] = "", returned_body[64] = "";
  while (outstanding > 0) {
    amqp_frame_t frame;
    check_status(amqp_simple_wait_frame(conn, &frame), "waiting for confirms");
    if (frame.frame_type != AMQP_FRAME_METHOD) fail("unexpected frame type %d", frame.frame_type);
    switch (frame.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD:
      case AMQP_BASIC_NACK_METHOD: {
        int is_ack = frame.payload.method.id == AMQP_BASIC_ACK_METHOD;
        uint64_t tag = is_ack ? ((amqp_basic_ack_t *)frame.payload.method.decoded)->delivery_tag
                              : ((amqp_basic_nack_t *)frame.payload.method.decoded)->delivery_tag;
        int multiple = is_ack ? ((amqp_basic_ack_t *)frame.payload.method.decoded)->multiple
                              : ((amqp_basic_nack_t *)frame.payload.method.decoded)->multiple;
        for (uint64_t t = multiple ? 1 : tag; t <= tag && t <= CONFIRMED + 1; t++) {
          if (confirmed[t] == 0) {
            confirmed[t] = is_ack ? 1 : 2;
            outstanding--;
          }
        }
        break;
      }
      case AMQP_BASIC_RETURN_METHOD: {
        amqp_basic_return_t *ret = frame.payload.method.decoded;
        returned_code = ret->reply_code;
        snprintf(returned_text, sizeof returned_text, "%.*s", (int)ret->reply_text.len, (char *)ret->reply_text.bytes);
        return_before_ack = confirmed[CONFIRMED + 1] == 0;
        amqp_message_t message;
        check(amqp_read_message(conn, frame.channel, &message, 0), "reading the returned message");
        snprintf(returned_body, sizeof returned_body, "%.*s", (int)message.body.len, (char *)message.body.bytes);
        amqp_destroy_message(&message);
        break;
      }
      default:
        fail("unexpected method 0x%08x while waiting for confirms", frame.payload.method.id);
    }
  }
  uint32_t left = message_count(1, queue);
  for (int outcome = 1; outcome <= 2; outcome++) { /* "acked": [tags], then "nacked": [tags] */
    printf(outcome == 1 ? "{\"ok\": true, \"acked\": [" : "], \"nacked\": [");
    for (int t = 1, first = 1; t <= CONFIRMED + 1; t++) {
      if (confirmed[t] != outcome) continue;
      printf("%s%d", first ? "" : ", ", t);
      first = 0;
    }
  }
  printf("], \"returned\": {\"code\": %d, \"text\": ", returned_code);
  json_string(returned_text, strlen(returned_text));
  printf(", \"body\": ");
  json_string(returned_body, strlen(returned_body));
  printf("}, \"return_before_ack\": %s, \"message_count\": %u}\n", return_before_ack ? "true" : "false", left);
  close_connection();
}

#define PREFETCHED 50
#define PREFETCH 10

/* basic.qos(10) and a manual-ack consumer on 50 messages: it holds ten unacked ones and no
 * eleventh comes until it acks; then every message arrives once, in order. */
static void scenario_prefetch(const char *url) {
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL);
  open_channel(1);
  amqp_bytes_t queue = declare_private_queue(1);
  char body[32];
  for (int i = 0; i < PREFETCHED; i++) {
    snprintf(body, sizeof body, "%d", i);
    publish_text(1, queue, body);
  }
  message_count(1, queue); /* a round trip: the publishes are in the queue */
  amqp_basic_qos(conn, 1, 0, PREFETCH, 0);
  check(amqp_get_rpc_reply(conn), "basic.qos");
  amqp_basic_consume(conn, 1, queue, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  check(amqp_get_rpc_reply(conn), "basic.consume");

  char bodies[PREFETCHED][32];
  uint64_t tags[PREFETCHED];
  int received = 0, redelivered = 0;
  while (received < PREFETCHED) {
    amqp_envelope_t envelope;
    amqp_rpc_reply_t reply = consume_within(&envelope, received < PREFETCH ? 5000 : 500);
    if (timed_out(reply) && received == PREFETCH) break; /* the limit holds: stop and ack */
    check(reply, "consuming");
    snprintf(bodies[received], sizeof bodies[received], "%.*s", (int)envelope.message.body.len,
             (char *)envelope.message.body.bytes);
    tags[received] = envelope.delivery_tag;
    redelivered += envelope.redelivered;
    received++;
    amqp_destroy_envelope(&envelope);
  }
  int held = received;
  for (int i = 0; i < held; i++) check_status(amqp_basic_ack(conn, 1, tags[i], 0), "basic.ack");
  while (received < PREFETCHED) {
    amqp_envelope_t envelope;
    check(consume_within(&envelope, 5000), "consuming after the first acks");
    snprintf(bodies[received], sizeof bodies[received], "%.*s", (int)envelope.message.body.len,
             (char *)envelope.message.body.bytes);
    redelivered += envelope.redelivered;
    check_status(amqp_basic_ack(conn, 1, envelope.delivery_tag, 0), "basic.ack");
    received++;
    amqp_destroy_envelope(&envelope);
  }
  printf("{\"ok\": true, \"held_before_ack\": %d, \"bodies\": [", held);
  for (int i = 0; i < received; i++) {
    printf("%s", i ? ", " : "");
    json_string(bodies[i], strlen(bodies[i]));
  }
  printf("], \"redelivered\": %d, \"message_count\": %u}\n", redelivered, message_count(1, queue));
  close_connection();
}

/* "0", "1", "2" and a consumer with prefetch 1: "0" rejected with requeue comes back first,
 * redelivered, and is acked; "1" is acked; "2" is rejected without requeue (gone). Then 200 ms
 * for anything more, which would be a fifth delivery. */
static void scenario_reject_requeue(const char *url) {
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL);
  open_channel(1);
  amqp_bytes_t queue = declare_private_queue(1);
  publish_text(1, queue, "0");
  publish_text(1, queue, "1");
  publish_text(1, queue, "2");
  amqp_basic_qos(conn, 1, 0, 1, 0);
  check(amqp_get_rpc_reply(conn), "basic.qos");
  amqp_basic_consume(conn, 1, queue, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  check(amqp_get_rpc_reply(conn), "basic.consume");
  char bodies[5][32];
  int redelivered[5], count = 0;
  while (count < 5) {
    amqp_envelope_t envelope;
    amqp_rpc_reply_t reply = consume_within(&envelope, count < 4 ? 5000 : 200);
    if (count == 4 && timed_out(reply)) break; /* nothing more: as it should be */
    check(reply, "consuming");
    amqp_bytes_t body = envelope.message.body;
    snprintf(bodies[count], sizeof bodies[count], "%.*s", (int)body.len, (char *)body.bytes);
    redelivered[count] = envelope.redelivered;
    if (strcmp(bodies[count], "0") == 0 && !envelope.redelivered)
      check_status(amqp_basic_reject(conn, 1, envelope.delivery_tag, 1), "basic.reject requeue");
    else if (strcmp(bodies[count], "2") == 0)
      check_status(amqp_basic_reject(conn, 1, envelope.delivery_tag, 0), "basic.reject");
    else
      check_status(amqp_basic_ack(conn, 1, envelope.delivery_tag, 0), "basic.ack");
    count++;
    amqp_destroy_envelope(&envelope);
  }
  uint32_t left = message_count(1, queue);
  printf("{\"ok\": true, \"deliveries\": [");
  for (int i = 0; i < count; i++) {
    printf("%s{\"body\": ", i ? ", " : "");
    json_string(bodies[i], strlen(bodies[i]));
    printf(", \"redelivered\": %s}", redelivered[i] ? "true" : "false");
  }
  printf("], \"message_count\": %u}\n", left);
  close_connection();
}

/* After a server's channel.close: close-ok, then the channel number is open again. */
static close_reason channel_closed(amqp_rpc_reply_t reply, amqp_channel_t channel) {
  if (reply.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION || reply.reply.id != AMQP_CHANNEL_CLOSE_METHOD)
    fail("expected a channel.close, got reply type %d", reply.reply_type);
  close_reason reason = reason_of(reply);
  amqp_channel_close_ok_t close_ok = {0};
  check_status(amqp_send_method(conn, channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok), "channel.close-ok");
  return reason;
}

/* Two channel errors on one connection: a passive declare of a missing queue (the reply to a
 * synchronous method), and an ack of an unknown delivery tag (no reply: the close comes on the
 * next call). After each the application opens the channel again and carries on. */
static void scenario_channel_error(const char *url) {
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL);
  open_channel(1);
  amqp_queue_declare(conn, 1, amqp_cstring_bytes("no-such-queue-c"), 1, 0, 0, 0, amqp_empty_table);
  close_reason missing = channel_closed(amqp_get_rpc_reply(conn), 1);

  open_channel(1);
  amqp_bytes_t queue = declare_private_queue(1);
  check_status(amqp_basic_ack(conn, 1, 99, 0), "basic.ack of an unknown tag");
  amqp_queue_declare(conn, 1, queue, 1, 0, 0, 0, amqp_empty_table);
  close_reason unknown_tag = channel_closed(amqp_get_rpc_reply(conn), 1);

  open_channel(1);
  publish_text(1, queue, "still here");
  char body[64];
  get_one(1, queue, body, sizeof body);
  printf("{\"ok\": true, \"missing_queue\": ");
  print_reason(missing);
  printf(", \"unknown_tag\": ");
  print_reason(unknown_tag);
  printf(", \"after\": ");
  json_string(body, strlen(body));
  printf("}\n");
  close_connection();
}

/* heartbeat 1 s, then 3 s in amqp_consume_message with nothing to deliver: the library sends
 * heartbeats and sees the broker's; the wait ends in a plain timeout, and the connection works. */
static void scenario_heartbeats(const char *url) {
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 1, NULL);
  open_channel(1);
  amqp_bytes_t queue = declare_private_queue(1);
  amqp_basic_consume(conn, 1, queue, amqp_empty_bytes, 0, 1, 0, amqp_empty_table);
  check(amqp_get_rpc_reply(conn), "basic.consume");
  amqp_envelope_t envelope;
  amqp_rpc_reply_t idle = consume_within(&envelope, 3000);
  const char *idle_result = timed_out(idle) ? "timeout"
                            : idle.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION ? amqp_error_string2(idle.library_error)
                                                                                 : "a delivery";
  if (idle.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && !timed_out(idle)) {
    printf("{\"ok\": true, \"heartbeat\": %d, \"idle\": ", amqp_get_heartbeat(conn));
    json_string(idle_result, strlen(idle_result));
    printf(", \"after\": null}\n");
    return;
  }
  publish_text(1, queue, "after the idle time");
  check(consume_within(&envelope, 5000), "consuming after the idle time");
  printf("{\"ok\": true, \"heartbeat\": %d, \"idle\": ", amqp_get_heartbeat(conn));
  json_string(idle_result, strlen(idle_result));
  printf(", \"after\": ");
  json_bytes(envelope.message.body);
  printf("}\n");
  amqp_destroy_envelope(&envelope);
  close_connection();
}

static unsigned char pattern_byte(size_t i) { return (unsigned char)((i * 31 + 7) % 251); }

/* frame_max 4096: bodies around one and two frames' payload, and up to 1 MiB + 1, each
 * published and got back intact (the sizes of client_expectations.large_message_sizes). */
static void scenario_large_message(const char *url) {
  connect_to(url, 4096, 0, NULL);
  open_channel(1);
  amqp_bytes_t queue = declare_private_queue(1);
  size_t payload = (size_t)amqp_get_frame_max(conn) - 8;
  size_t sizes[] = {0, 1, payload - 1, payload, payload + 1, 2 * payload, 2 * payload + 1,
                    100000, 1 << 20, (1 << 20) + 1};
  int count = sizeof sizes / sizeof sizes[0];
  for (int n = 0; n < count; n++) {
    amqp_bytes_t body = amqp_bytes_malloc(sizes[n]);
    for (size_t i = 0; i < sizes[n]; i++) ((unsigned char *)body.bytes)[i] = pattern_byte(i);
    publish(1, amqp_empty_bytes, queue, 0, body);
    amqp_bytes_free(body);
  }
  printf("{\"ok\": true, \"frame_max\": %d, \"bodies\": [", amqp_get_frame_max(conn));
  for (int n = 0; n < count; n++) {
    amqp_rpc_reply_t reply = amqp_basic_get(conn, 1, queue, 1);
    check(reply, "basic.get");
    if (reply.reply.id != AMQP_BASIC_GET_OK_METHOD) fail("basic.get-empty for body %d", n);
    amqp_message_t message;
    check(amqp_read_message(conn, 1, &message, 0), "reading a large message");
    int intact = message.body.len == sizes[n];
    for (size_t i = 0; intact && i < message.body.len; i++)
      intact = ((unsigned char *)message.body.bytes)[i] == pattern_byte(i);
    printf("%s{\"size\": %zu, \"intact\": %s}", n ? ", " : "", message.body.len, intact ? "true" : "false");
    amqp_destroy_message(&message);
    amqp_maybe_release_buffers(conn);
  }
  printf("]}\n");
  close_connection();
}

/* amqps with the test CA, the peer and its host name verified: a message there and back. */
static void scenario_tls(const char *url, const char *ca_file) {
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, ca_file);
  open_channel(1);
  amqp_bytes_t queue = declare_private_queue(1);
  publish_text(1, queue, "over tls");
  char body[64];
  get_one(1, queue, body, sizeof body);
  printf("{\"ok\": true, \"body\": ");
  json_string(body, strlen(body));
  printf("}\n");
  close_connection();
}

static long now_ms(void) {
  struct timeval now;
  gettimeofday(&now, NULL);
  return now.tv_sec * 1000L + now.tv_usec / 1000;
}

/* The next connection.blocked, connection.unblocked or basic.ack within `milliseconds`, by
 * name ("blocked", "unblocked", "ack"); NULL when none came. A connection.blocked's reason goes
 * to `reason`. */
static const char *next_alarm_method(long milliseconds, char *reason, size_t size) {
  struct timeval timeout = {milliseconds / 1000, (milliseconds % 1000) * 1000};
  amqp_frame_t frame;
  int status = amqp_simple_wait_frame_noblock(conn, &frame, &timeout);
  if (status == AMQP_STATUS_TIMEOUT) return NULL;
  check_status(status, "waiting for the alarm's methods");
  if (frame.frame_type != AMQP_FRAME_METHOD) fail("unexpected frame type %d under the alarm", frame.frame_type);
  switch (frame.payload.method.id) {
    case AMQP_CONNECTION_BLOCKED_METHOD: {
      amqp_bytes_t text = ((amqp_connection_blocked_t *)frame.payload.method.decoded)->reason;
      snprintf(reason, size, "%.*s", (int)text.len, (char *)text.bytes);
      return "blocked";
    }
    case AMQP_CONNECTION_UNBLOCKED_METHOD:
      return "unblocked";
    case AMQP_BASIC_ACK_METHOD:
      return "ack";
    default:
      fail("unexpected method 0x%08x under the alarm", frame.payload.method.id);
  }
}

/* `item` added to the comma-separated `list`. */
static void add_to(char *list, size_t size, const char *item) {
  size_t used = strlen(list);
  snprintf(list + used, size - used, "%s%s", used ? "," : "", item);
}

/* A confirmed publish through a memory alarm. At "ready" the test raises the alarm; the publish
 * meets it. With the connection.blocked capability announced the broker says connection.blocked;
 * without it (the library's default) it says nothing. Either way nothing more may come in the
 * next half second: what does is `while_blocked`. At "blocked" the test clears the alarm:
 * connection.unblocked (when announced) and the publish's ack follow, and the message is in the
 * queue. `order` is every method that came, in order. */
static void scenario_blocked(const char *url, int announce) {
  announce_blocked = announce;
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL);
  open_channel(1);
  amqp_confirm_select(conn, 1);
  check(amqp_get_rpc_reply(conn), "confirm.select");
  amqp_bytes_t queue = declare_private_queue(1);
  event("ready");
  publish_text(1, queue, "held");
  char order[256] = "", reason[256] = "", while_blocked[256] = "";
  const char *method = NULL;
  if (announce) {
    method = next_alarm_method(20000, reason, sizeof reason);
    if (method == NULL) fail("no connection.blocked within 20 s");
    add_to(order, sizeof order, method);
  }
  int acked = method != NULL && strcmp(method, "ack") == 0, unblocked = !announce;
  for (long deadline = now_ms() + 500, left; (left = deadline - now_ms()) > 0;) {
    if ((method = next_alarm_method(left, reason, sizeof reason)) == NULL) break;
    add_to(order, sizeof order, method);
    add_to(while_blocked, sizeof while_blocked, method);
    acked |= strcmp(method, "ack") == 0;
    unblocked |= strcmp(method, "unblocked") == 0;
  }
  event("blocked");
  while (!(acked && unblocked)) {
    if ((method = next_alarm_method(20000, reason, sizeof reason)) == NULL)
      fail("no ack and connection.unblocked within 20 s of the alarm's end");
    add_to(order, sizeof order, method);
    acked |= strcmp(method, "ack") == 0;
    unblocked |= strcmp(method, "unblocked") == 0;
  }
  char body[64];
  get_one(1, queue, body, sizeof body);
  printf("{\"ok\": true, \"reason\": ");
  json_string(reason, strlen(reason));
  printf(", \"while_blocked\": [");
  for (char *item = strtok(while_blocked, ","), *first = item; item != NULL; item = strtok(NULL, ","))
    printf("%s\"%s\"", item == first ? "" : ", ", item);
  printf("], \"order\": \"%s\", \"body\": ", order);
  json_string(body, strlen(body));
  printf("}\n");
  close_connection();
}

static void sleep_ms(long milliseconds) {
  struct timespec pause = {milliseconds / 1000, (milliseconds % 1000) * 1000000};
  nanosleep(&pause, NULL);
}

/* Consume from `queue` on channel 1 with manual acks; the next delivery within 10 s. */
static amqp_envelope_t consume_next(amqp_bytes_t queue, int start) {
  if (start) {
    amqp_basic_consume(conn, 1, queue, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
    check(amqp_get_rpc_reply(conn), "basic.consume");
  }
  amqp_envelope_t envelope;
  check(consume_within(&envelope, 10000), "consuming");
  return envelope;
}

static void print_delivery(amqp_envelope_t *envelope) {
  printf("{\"body\": ");
  json_bytes(envelope->message.body);
  printf(", \"redelivered\": %s}", envelope->redelivered ? "true" : "false");
}

/* A consumer on a durable queue holds a persistent message unacked when, at "ready", the test
 * restarts the broker. rabbitmq-c has no recovery of its own: the application sees the broker's connection.close,
 * answers it, connects again (every 0.2 s), consumes again and gets the unacked message back
 * redelivered, then a new one. */
static void scenario_restart(const char *url) {
  char name[64];
  snprintf(name, sizeof name, "c-restart-%d", (int)getpid());
  amqp_bytes_t queue = amqp_cstring_bytes(name);
  connect_to(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL);
  open_channel(1);
  amqp_queue_declare(conn, 1, queue, 0, 1, 0, 0, amqp_empty_table);
  check(amqp_get_rpc_reply(conn), "queue.declare durable");
  amqp_basic_properties_t persistent = {._flags = AMQP_BASIC_DELIVERY_MODE_FLAG, .delivery_mode = AMQP_DELIVERY_PERSISTENT};
  amqp_tx_select(conn, 1); /* the commit returns once the message is stored */
  check(amqp_get_rpc_reply(conn), "tx.select");
  check_status(amqp_basic_publish(conn, 1, amqp_empty_bytes, queue, 0, 0, &persistent, amqp_cstring_bytes("in flight")),
               "basic.publish");
  amqp_tx_commit(conn, 1);
  check(amqp_get_rpc_reply(conn), "tx.commit");
  amqp_envelope_t first = consume_next(queue, 1);
  event("ready");

  /* The next thing the broker says is its connection.close. */
  amqp_envelope_t envelope;
  amqp_maybe_release_buffers(conn);
  amqp_rpc_reply_t reply = amqp_consume_message(conn, &envelope, NULL, 0);
  close_reason closed = {0};
  const char *seen = "";
  if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && reply.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
    amqp_frame_t frame;
    check_status(amqp_simple_wait_frame(conn, &frame), "reading the frame after the deliveries");
    if (frame.frame_type == AMQP_FRAME_METHOD && frame.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD) {
      amqp_rpc_reply_t as_reply = {AMQP_RESPONSE_SERVER_EXCEPTION, frame.payload.method, 0};
      closed = reason_of(as_reply);
      amqp_connection_close_ok_t close_ok = {0};
      amqp_send_method(conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &close_ok);
      seen = "connection.close";
    } else {
      seen = "another frame";
    }
  } else if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
    seen = amqp_error_string2(reply.library_error);
  } else {
    seen = "a delivery";
  }
  amqp_destroy_envelope(&first);
  amqp_destroy_connection(conn);

  int attempts = 1;
  while (!try_connect(url, AMQP_DEFAULT_FRAME_SIZE, 0, NULL, 0)) {
    if (attempts++ > 150) fail("no connection within 30 s of the broker's restart");
    sleep_ms(200);
  }
  open_channel(1);
  amqp_queue_declare(conn, 1, queue, 0, 1, 0, 0, amqp_empty_table);
  check(amqp_get_rpc_reply(conn), "queue.declare durable after the restart");
  amqp_envelope_t again = consume_next(queue, 1);
  check_status(amqp_basic_ack(conn, 1, again.delivery_tag, 0), "basic.ack");
  publish_text(1, queue, "after the restart");
  amqp_envelope_t after = consume_next(queue, 0);
  check_status(amqp_basic_ack(conn, 1, after.delivery_tag, 0), "basic.ack");
  printf("{\"ok\": true, \"seen\": \"%s\", \"closed\": ", seen);
  print_reason(closed);
  printf(", \"reconnected\": true, \"deliveries\": [");
  print_delivery(&again);
  printf(", ");
  print_delivery(&after);
  printf("]}\n");
  amqp_destroy_envelope(&again);
  amqp_destroy_envelope(&after);
  amqp_queue_delete(conn, 1, queue, 0, 0);
  check(amqp_get_rpc_reply(conn), "queue.delete");
  close_connection();
}

int main(int argc, char **argv) {
  if (argc < 3) fail("usage: scenarios <scenario> <amqp-url> [ca-file]");
  const char *scenario = argv[1], *url = argv[2];
  if (strcmp(scenario, "connect") == 0) scenario_connect(url);
  else if (strcmp(scenario, "confirms") == 0) scenario_confirms(url);
  else if (strcmp(scenario, "prefetch") == 0) scenario_prefetch(url);
  else if (strcmp(scenario, "reject_requeue") == 0) scenario_reject_requeue(url);
  else if (strcmp(scenario, "channel_error") == 0) scenario_channel_error(url);
  else if (strcmp(scenario, "heartbeats") == 0) scenario_heartbeats(url);
  else if (strcmp(scenario, "large_message") == 0) scenario_large_message(url);
  else if (strcmp(scenario, "tls") == 0) scenario_tls(url, argc > 3 ? argv[3] : NULL);
  else if (strcmp(scenario, "blocked") == 0) scenario_blocked(url, 1);
  else if (strcmp(scenario, "blocked_unannounced") == 0) scenario_blocked(url, 0);
  else if (strcmp(scenario, "restart") == 0) scenario_restart(url);
  else fail("unknown scenario %s", scenario);
  return 0;
}
