// What the queue and exchange pages share: the bindings table, the add-binding form and the
// publish form.

import { h, jsonText, seg } from '../dom.js';
import { post, del, api } from '../api.js';
import { table, form, field, textInput, select, parseObject, confirmAction, act, showOk, showError } from '../widgets.js';

const DEFAULT_EXCHANGE = 'amq.default'; // the default exchange ("") in API paths

export function exchangeHref(vhost, name) {
  return `#/exchanges/${seg(vhost)}/${seg(name || DEFAULT_EXCHANGE)}`;
}

function endLink(vhost, name, type) {
  if (type === 'queue') return h('a', { href: `#/queues/${seg(vhost)}/${seg(name)}` }, name);
  return h('a', { href: exchangeHref(vhost, name) }, name || '(AMQP default)');
}

// bindings: the API's binding objects; showSource / showDestination pick the columns.
export function bindingsTable(bindings, { vhost, onChange, showSource = true, showDestination = true }) {
  const unbind = async (binding) => {
    const kind = binding.destination_type === 'queue' ? 'q' : 'e';
    const what = `the binding from ${binding.source || '(AMQP default)'} to ${binding.destination} with routing key "${binding.routing_key}"`;
    if (!await confirmAction(`Remove ${what}?`, { confirmLabel: 'Unbind' })) return;
    const path = api`/api/bindings/${vhost}/e/${binding.source || DEFAULT_EXCHANGE}/` + `${kind}/`
      + api`${binding.destination}/${binding.properties_key}`;
    if (await act(() => del(path), 'Binding removed.', 'Unbind')) await onChange().catch(showError);
  };
  return table([
    showSource ? { title: 'From exchange', cls: 'name', cell: (b) => endLink(vhost, b.source, 'exchange') } : null,
    showDestination ? { title: 'To', cls: 'name', cell: (b) => [endLink(vhost, b.destination, b.destination_type), ` (${b.destination_type})`] } : null,
    { title: 'Routing key', cls: 'wrap', cell: (b) => h('code', {}, b.routing_key) },
    { title: 'Arguments', cls: 'wrap', cell: (b) => h('code', {}, jsonText(b.arguments)) },
    { title: '', cell: (b) => (b.source === '' ? h('span.muted', { title: 'Every queue is bound to the default exchange by its name; this cannot be removed.' }, 'implicit')
      : h('button.small.danger', { type: 'button', name: 'unbind', onclick: () => unbind(b) }, 'Unbind')) },
  ].filter(Boolean), bindings, { empty: 'No bindings.' });
}

// From the queue's page: give `destination` (and destinationType 'q'); from an exchange's page:
// give `source`, and the form asks for the destination.
export function bindingForm(app, { vhost, source = null, destination = null, destinationType = 'q', onDone }) {
  const sourceInput = source === null ? textInput('source', { required: true, placeholder: 'amq.direct' }) : null;
  const typeSelect = destination === null ? select('destination_type', [['q', 'Queue'], ['e', 'Exchange']], 'q') : null;
  const destinationInput = destination === null ? textInput('destination', { required: true }) : null;
  const routingKey = textInput('routing_key');
  const args = h('textarea', { name: 'binding_arguments', placeholder: '{"x-match": "all", "format": "pdf"}' });
  return form('stacked', [
    sourceInput ? field('From exchange', sourceInput) : null,
    typeSelect ? field('To', typeSelect) : null,
    destinationInput ? field('Destination name', destinationInput) : null,
    field('Routing key', routingKey),
    field('Arguments (JSON)', args),
  ], async () => {
    const from = source ?? sourceInput.value;
    const to = destination ?? destinationInput.value;
    const kind = typeSelect ? typeSelect.value : destinationType;
    await post(api`/api/bindings/${vhost}/e/${from || DEFAULT_EXCHANGE}/` + `${kind}/` + api`${to}`,
      { routing_key: routingKey.value, arguments: parseObject(args.value, 'Arguments') });
    showOk(`Bound ${to} to ${from} with routing key "${routingKey.value}".`);
    routingKey.value = '';
    await onDone();
  }, 'Bind');
}

export function publishForm({ vhost, exchange, routingKey = '', onDone }) {
  const key = textInput('publish_routing_key', { value: routingKey });
  const deliveryMode = select('delivery_mode', [['2', '2 - persistent'], ['1', '1 - non-persistent']], '2');
  const headers = h('textarea', { name: 'publish_headers', placeholder: '{"trace-id": "abc", "attempt": 1}' });
  const properties = h('textarea', { name: 'publish_properties', placeholder: '{"content_type": "application/json", "message_id": "m-1"}' });
  const payload = h('textarea', { name: 'payload' });
  const encoding = select('payload_encoding', [['string', 'Text'], ['base64', 'Base64']], 'string');
  const result = h('span.publish-result');
  return h('div', {}, form('stacked', [
    field('Routing key', key), field('Delivery mode', deliveryMode),
    field('Headers (JSON)', headers), field('Properties (JSON)', properties),
    field('Payload', payload), field('Payload encoding', encoding),
  ], async () => {
    const props = { ...parseObject(properties.value, 'Properties'), delivery_mode: Number(deliveryMode.value) };
    const parsedHeaders = parseObject(headers.value, 'Headers');
    if (Object.keys(parsedHeaders).length) props.headers = parsedHeaders;
    const answer = await post(api`/api/exchanges/${vhost}/${exchange || DEFAULT_EXCHANGE}/publish`, {
      routing_key: key.value, properties: props, payload: payload.value, payload_encoding: encoding.value });
    const text = answer.routed ? 'Message published.' : 'Message published, but no queue is bound for it: it was not routed.';
    result.textContent = text;
    showOk(text);
    await onDone();
  }, 'Publish message'), result);
}
