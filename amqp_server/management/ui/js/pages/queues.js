// Queues: the paged list (server-side paging, sorting and name filter, so 10,000 queues cost
// one page), adding a queue, and a queue's page: figures, rate chart, consumers, bindings,
// getting and publishing messages, moving them to another queue (a shovel), purge and delete.

import { h, replace, num, rate, rateOf, bytes, jsonText, seg, when } from '../dom.js';
import { get, put, post, del, api } from '../api.js';
import {
  PagedList, PolledChart, table, kvTable, form, field, textInput, select, checkbox, parseObject, section,
  queueFeatures, confirmAction, act, showOk, showError,
} from '../widgets.js';
import { bindingsTable, bindingForm, publishForm } from './shared.js';

const LIST_COLUMNS = 'name,vhost,type,state,durable,auto_delete,exclusive,arguments,policy,operator_policy,consumers,'
  + 'messages,messages_ready,messages_unacknowledged,message_stats.publish_details.rate,'
  + 'message_stats.deliver_get_details.rate,message_stats.ack_details.rate';

export function queueHref(vhost, name) {
  return `#/queues/${seg(vhost)}/${seg(name)}`;
}

export function renderList(app) {
  const columns = [
    app.vhost ? null : { title: 'Virtual host', sort: 'vhost', cell: (q) => q.vhost },
    { title: 'Name', sort: 'name', cls: 'name', cell: (q) => h('a', { href: queueHref(q.vhost, q.name) }, q.name) },
    { title: 'Type', cell: (q) => q.type },
    { title: 'Features', cell: (q) => queueFeatures(q) },
    { title: 'State', sort: 'state', cell: (q) => h(`span.state-${q.state}`, {}, q.state) },
    { title: 'Ready', num: true, sort: 'messages_ready', cell: (q) => num(q.messages_ready) },
    { title: 'Unacked', num: true, sort: 'messages_unacknowledged', cell: (q) => num(q.messages_unacknowledged) },
    { title: 'Total', num: true, sort: 'messages', cell: (q) => num(q.messages) },
    { title: 'Incoming', num: true, sort: 'message_stats.publish_details.rate', cell: (q) => rate(rateOf(q.message_stats, 'publish')) },
    { title: 'Deliver / get', num: true, sort: 'message_stats.deliver_get_details.rate', cell: (q) => rate(rateOf(q.message_stats, 'deliver_get')) },
    { title: 'Ack', num: true, sort: 'message_stats.ack_details.rate', cell: (q) => rate(rateOf(q.message_stats, 'ack')) },
    { title: 'Consumers', num: true, sort: 'consumers', cell: (q) => num(q.consumers) },
  ].filter(Boolean);
  const list = new PagedList({
    path: () => (app.vhost ? api`/api/queues/${app.vhost}` : '/api/queues'),
    columns, columnsParam: LIST_COLUMNS, empty: 'No queues.',
  });
  const el = h('div', {},
    h('div.page-head', {}, h('h1', {}, 'Queues'), h('span.muted', {}, app.vhost ? `in virtual host ${app.vhost}` : 'in all virtual hosts')),
    h('div.panel', {}, list.el),
    section('Add a queue', addQueueForm(app, () => list.refresh())));
  return { el, refresh: () => list.refresh() };
}

function addQueueForm(app, done) {
  const vhost = select('vhost', app.vhostChoices(), app.vhost);
  const name = textInput('name', { required: true });
  const durable = checkbox('durable', 'Durable', true);
  const autoDelete = checkbox('auto_delete', 'Auto-delete');
  const args = h('textarea', { name: 'arguments', placeholder: '{"x-message-ttl": 60000, "x-dead-letter-exchange": "dlx"}' });
  return form('stacked', [
    field('Virtual host', vhost), field('Name', name),
    field('Options', h('div.checks', {}, durable.el, autoDelete.el)),
    field('Arguments (JSON)', args),
  ], async () => {
    const body = { durable: durable.box.checked, auto_delete: autoDelete.box.checked, arguments: parseObject(args.value, 'Arguments') };
    await put(api`/api/queues/${vhost.value}/${name.value}`, body);
    showOk(`Queue ${name.value} declared in ${vhost.value}.`);
    name.value = '';
    await done();
  }, 'Add queue');
}

// ---- one queue -----------------------------------------------------------------------------

const ACKMODES = [
  ['peek', 'Peek: look without taking (nothing changes)'],
  ['ack_requeue_true', 'Nack, requeue (RabbitMQ\'s default; marks them redelivered)'],
  ['reject_requeue_true', 'Reject, requeue'],
  ['ack_requeue_false', 'Ack: remove them from the queue'],
  ['reject_requeue_false', 'Reject, no requeue (dead-letters them)'],
];

export function renderDetail(app, vhost, name) {
  const base = api`/api/queues/${vhost}/${name}`;
  const summary = h('div.grid');
  const consumers = h('div');
  const bindings = h('div');
  const chart = new PolledChart('queue-rates', ['Publish', 'Deliver / get', 'Ack', 'Redeliver'], { valueFormat: (v) => rate(v), height: 180 });
  const depthChart = new PolledChart('queue-depth', ['Ready', 'Unacked'], { valueFormat: (v) => num(Math.round(v)), height: 180, counts: true });
  const messages = h('div.messages');

  async function refresh() {
    const [queue, queueBindings] = await Promise.all([get(base), get(`${base}/bindings`)]);
    const stream = queue.type === 'stream';
    showSummary(queue, stream);
    const stats = queue.message_stats || {};
    chart.push(['publish', 'deliver_get', 'ack', 'redeliver'].map((f) => rateOf(stats, f) ?? 0));
    depthChart.push([queue.messages_ready, queue.messages_unacknowledged]);
    showConsumers(queue.consumer_details || [], stream);
    // A stream is read by consumers from offsets: get takes nothing from it, and a purge (540
    // over AMQP) removes nothing.
    getSection.hidden = stream;
    moveSection.hidden = stream;
    purgeButton.hidden = stream;
    replace(bindings, bindingsTable(queueBindings, { vhost, onChange: refresh, showSource: true }));
  }

  function showSummary(queue, stream) {
    const owner = queue.owner_pid_details;
    replace(summary,
      h('div.panel', {}, h('h2', {}, 'Details'), kvTable([
        ['Virtual host', queue.vhost],
        ['Type', queue.type],
        ['State', h(`span.state-${queue.state}`, {}, queue.state)],
        ['Features', queueFeatures(queue)],
        ['Arguments', h('code', {}, jsonText(queue.arguments))],
        ['Policy', queue.policy || '–'],
        queue.policy || queue.operator_policy ? ['Effective policy definition', h('code', {}, jsonText(queue.effective_policy_definition))] : null,
        owner ? ['Exclusive owner', h('a', { href: `#/connections/${seg(owner.name)}` }, owner.name)] : null,
        ['Consumers', num(queue.consumers)],
        stream ? null : ['Consumer utilisation', queue.consumers ? `${Math.round((queue.consumer_utilisation || 0) * 100)} %` : '–'],
        ['Memory (estimate)', bytes(queue.memory)],
      ])),
      stream ? streamPanel(queue) : h('div.panel', {}, h('h2', {}, 'Messages'), kvTable([
        ['Ready', num(queue.messages_ready)],
        ['Unacked', num(queue.messages_unacknowledged)],
        ['Total', num(queue.messages)],
        ['Waiting for delayed retry', num(queue.messages_delayed)],
        ['Paged out to disk', num(queue.messages_paged_out)],
        ['Bytes (ready / unacked)', `${bytes(queue.message_bytes_ready)} / ${bytes(queue.message_bytes_unacknowledged)}`],
        ['Publish', rate(rateOf(queue.message_stats, 'publish'))],
        ['Deliver / get', rate(rateOf(queue.message_stats, 'deliver_get'))],
        ['Ack', rate(rateOf(queue.message_stats, 'ack'))],
        ['Redeliver', rate(rateOf(queue.message_stats, 'redeliver'))],
      ])));
  }

  function showConsumers(list, stream) {
    replace(consumers, table([
      { title: 'Consumer tag', cls: 'wrap', cell: (c) => c.consumer_tag },
      stream ? { title: 'Offset', num: true, help: 'The offset this consumer reads next', cell: (c) => num(c.stream_offset) } : null,
      { title: 'Channel', cls: 'wrap', cell: (c) => h('a', { href: `#/channels/${seg(c.channel_details.name)}` }, c.channel_details.name) },
      { title: 'Connection', cls: 'wrap', cell: (c) => h('a', { href: `#/connections/${seg(c.channel_details.connection_name)}` }, c.channel_details.connection_name) },
      { title: 'Ack required', cell: (c) => (c.ack_required ? 'yes (manual ack)' : 'no (auto ack)') },
      { title: 'Prefetch', num: true, cell: (c) => num(c.prefetch_count) },
      { title: 'Exclusive', cell: (c) => (c.exclusive ? 'yes' : 'no') },
      { title: 'Arguments', cls: 'wrap', cell: (c) => h('code', {}, jsonText(c.arguments)) },
    ].filter(Boolean), list, { empty: 'No consumers.' }));
  }

  const getSection = section('Get messages', getMessagesForm(base, messages), true);
  const moveSection = section('Move messages', moveMessagesForm(vhost, name, refresh));
  const danger = dangerZone(app, vhost, name, base, refresh);
  const purgeButton = danger.querySelector('button[name=purge]');

  const el = h('div', {},
    h('div.page-head', {}, h('h1', {}, 'Queue ', h('span.mono', {}, name)), h('span.muted', {}, `in virtual host ${vhost}`)),
    summary,
    h('div.grid', {},
      h('div.panel', {}, h('h2', {}, 'Message rates (since this page opened)'), chart.el),
      h('div.panel', {}, h('h2', {}, 'Queued messages (since this page opened)'), depthChart.el)),
    h('div.panel', {}, h('h2', {}, 'Consumers'), consumers),
    h('div.panel', {}, h('h2', {}, 'Bindings'), bindings,
      h('h3', {}, 'Add a binding to this queue'), bindingForm(app, { vhost, destination: name, destinationType: 'q', onDone: refresh })),
    getSection,
    moveSection,
    section('Publish a message', publishForm({ vhost, exchange: '', routingKey: name, onDone: refresh })),
    section('Purge and delete', danger));
  return { el, refresh, destroy() { chart.destroy(); depthChart.destroy(); } };
}

// A stream's log: its records (RabbitMQ counts them all ready), the offsets a consumer can
// start from, its segment files and the bytes they take on disk. On a cluster they are the
// leader's; where the leader did not answer this node (a UI session is this node's only), they
// are this node's replica's, and the panel says so.
function streamPanel(queue) {
  const offset = (value) => (value === null || value === undefined ? '–' : num(value));
  const segments = queue.stream_segment_details || [];
  const from = queue.stream_figures_node;
  const whose = from === undefined ? '–' : from === queue.node ? from : `${from} (its replica, as last replicated)`;
  return h('div.panel.stream', {}, h('h2', {}, 'Stream'), kvTable([
    ['Figures of', h('span', { dataset: { field: 'figures-node' } }, whose)],
    ['Records', num(queue.messages)],
    ['First offset', h('span', { dataset: { field: 'first-offset' } }, offset(queue.stream_first_offset))],
    ['Last offset', h('span', { dataset: { field: 'last-offset' } }, offset(queue.stream_last_offset))],
    ['Segments', h('span', { dataset: { field: 'segments' } }, num(queue.stream_segments))],
    ['Bytes on disk', h('span', { dataset: { field: 'disk-bytes' } }, bytes(queue.stream_disk_bytes))],
    ['Publish', rate(rateOf(queue.message_stats, 'publish'))],
    ['Deliver', rate(rateOf(queue.message_stats, 'deliver_get'))],
    ['Ack', rate(rateOf(queue.message_stats, 'ack'))],
  ]), segments.length ? h('div.segments', {}, h('h3', {}, 'Segments'), table([
    { title: 'First offset', num: true, cell: (s) => num(s.first_offset) },
    { title: 'Records', num: true, cell: (s) => num(s.next_offset - s.first_offset) },
    { title: 'Size', num: true, cell: (s) => bytes(s.bytes) },
    { title: 'Oldest record', cell: (s) => when(s.first_timestamp) },
    { title: 'Newest record', cell: (s) => when(s.last_timestamp) },
  ], segments)) : null);
}

function getMessagesForm(base, output) {
  const ackmode = select('ackmode', ACKMODES, 'peek');
  const encoding = select('encoding', [['auto', 'Auto: text as text, other bytes as base64'], ['base64', 'Base64']], 'auto');
  const count = h('input', { type: 'number', name: 'count', min: '1', max: '1000', value: '1' });
  const truncate = h('input', { type: 'number', name: 'truncate', min: '0', value: '50000' });
  return h('div', {}, form('stacked', [
    field('Ack mode', ackmode), field('Encoding', encoding), field('Messages', count), field('Truncate after (bytes)', truncate),
  ], async () => {
    const got = await post(`${base}/get`, { count: Number(count.value), ackmode: ackmode.value, encoding: encoding.value,
      truncate: truncate.value === '' ? null : Number(truncate.value) });
    replace(output, got.length ? got.map((message, index) => messageView(message, index + 1)) : h('p.empty', {}, 'The queue has no ready messages.'));
  }, 'Get messages'), output);
}

// "Move messages", as RabbitMQ's shovel plugin adds it to the queue page: a dynamic shovel
// "Move from <queue>" that takes what the queue holds now into the destination queue (on-confirm,
// src-delete-after queue-length) and deletes itself when done. Its state is shown while it runs.
export function moveShovelValue(vhost, queue, destination) {
  const uri = `amqp:///${encodeURIComponent(vhost)}`;
  return {
    'src-uri': uri, 'src-queue': queue, 'src-protocol': 'amqp091', 'src-prefetch-count': 1000,
    'src-delete-after': 'queue-length', 'dest-protocol': 'amqp091', 'dest-uri': uri,
    'dest-add-forward-headers': false, 'ack-mode': 'on-confirm', 'dest-queue': destination,
  };
}

function moveMessagesForm(vhost, queue, refresh) {
  const destination = textInput('destination_queue', { required: true });
  const progress = h('div.move-status');
  const shovel = `Move from ${queue}`;
  async function watch() {
    for (;;) {
      let listed;
      try {
        listed = await get(api`/api/shovels/vhost/${vhost}/${shovel}`);
      } catch (error) {
        if (error.status === 404) {  // done: the shovel deleted itself
          replace(progress, h('p.ok', {}, 'Messages moved.'));
          await refresh().catch(showError);
          return;
        }
        throw error;
      }
      const status = listed[0] || {};
      const detail = status.state === 'terminated' ? `terminated: ${status.reason}`
        : `${status.state || 'starting'}${status.last_error ? ` (last error: ${status.last_error})` : ''}`;
      replace(progress, h('p', {}, `Shovel "${shovel}": ${detail}; ${num(status.messages_acked || 0)} moved.`));
      if (status.state === 'terminated') return;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
  return h('div', {}, h('p.muted', {},
    'Moves the messages the queue holds now to another queue of this virtual host (declared if it does not exist), '
    + 'with a shovel that deletes itself when it is done.'),
  form('stacked', [field('Destination queue', destination)], async () => {
    await put(api`/api/parameters/shovel/${vhost}/${shovel}`, { value: moveShovelValue(vhost, queue, destination.value) });
    showOk(`Moving messages from ${queue} to ${destination.value}.`);
    watch().catch(showError);
  }, 'Move messages'), progress);
}

function messageView(message, position) {
  const properties = { ...(message.properties || {}) };
  const headers = properties.headers || {};
  delete properties.headers;
  return h('div.message', { dataset: { position: String(position) } },
    h('h3', {}, `Message ${position}`),
    kvTable([
      ['Exchange', message.exchange || '(AMQP default)'],
      ['Routing key', message.routing_key],
      ['Redelivered', message.redelivered ? 'yes' : 'no'],
      ['Left in queue', num(message.message_count)],
    ]),
    h('h3', {}, 'Properties'),
    Object.keys(properties).length ? kvTable(Object.entries(properties).map(([key, value]) => [key, h('code', {}, jsonText(value))])) : h('p.empty', {}, 'None.'),
    h('h3', {}, 'Headers'),
    Object.keys(headers).length ? h('div.headers', {}, kvTable(Object.entries(headers).map(([key, value]) => [key, h('code', {}, jsonText(value))]))) : h('p.empty', {}, 'None.'),
    h('h3', {}, `Payload (${num(message.payload_bytes)} bytes, ${message.payload_encoding === 'base64' ? 'base64' : 'text'})`),
    h('pre.payload', { dataset: { encoding: message.payload_encoding } }, message.payload));
}

function dangerZone(app, vhost, name, base, refresh) {
  const ifEmpty = checkbox('if-empty', 'only if empty');
  const ifUnused = checkbox('if-unused', 'only if it has no consumers');
  const purge = h('button.danger', { type: 'button', name: 'purge', onclick: async () => {
    if (!await confirmAction(`Purge queue "${name}" in ${vhost}? Its ready messages are deleted.`, { confirmLabel: 'Purge' })) return;
    if (await act(() => del(`${base}/contents`), `Queue ${name} purged.`, 'Purge')) await refresh().catch(showError);
  } }, 'Purge messages');
  const remove = h('button.danger', { type: 'button', name: 'delete', onclick: async () => {
    if (!await confirmAction(`Delete queue "${name}" in ${vhost} and every message in it?`)) return;
    const query = new URLSearchParams();
    if (ifEmpty.box.checked) query.set('if-empty', 'true');
    if (ifUnused.box.checked) query.set('if-unused', 'true');
    if (await act(() => del(`${base}${query.size ? `?${query}` : ''}`), `Queue ${name} deleted.`, 'Delete')) app.go('#/queues');
  } }, 'Delete queue');
  return h('div.stack', {},
    h('div.actions', {}, purge),
    h('div.actions', {}, remove, ifEmpty.el, ifUnused.el));
}
