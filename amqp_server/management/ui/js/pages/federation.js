// Admin > Federation: the federation upstreams (runtime parameters of component
// federation-upstream), a form to add or change one, and the links with their status, error,
// reconnects and counters (/api/federation-links), each with a Restart button. A federation
// policy (Policies tab) with "federation-upstream" or "federation-upstream-set" starts links.

import { h, replace, num, jsonText } from '../dom.js';
import { get, put, del, api } from '../api.js';
import { table, form, field, textInput, select, confirmAction, act, showOk, showError } from '../widgets.js';

const ACK_MODES = ['on-confirm', 'on-publish', 'no-ack'];

export function federation(app) {
  const upstreamBox = h('div');
  const linkBox = h('div');

  async function refresh() {
    const [upstreams, links] = await Promise.all([get('/api/parameters/federation-upstream'), get('/api/federation-links')]);
    const shown = app.vhost ? upstreams.filter((u) => u.vhost === app.vhost) : upstreams;
    replace(upstreamBox, table([
      { title: 'Virtual host', cell: (u) => u.vhost }, { title: 'Name', cls: 'name', cell: (u) => u.name },
      { title: 'URI', cls: 'wrap', cell: (u) => h('code', {}, [].concat(u.value.uri).map(redacted).join(' ')) },
      { title: 'Settings', cls: 'wrap', cell: (u) => h('code', {}, jsonText(Object.fromEntries(Object.entries(u.value).filter(([k]) => k !== 'uri')))) },
      { title: '', cell: (u) => h('button.small.danger', { type: 'button', name: 'delete-upstream', onclick: () => remove(u) }, 'Delete') },
    ], shown, { empty: 'No upstreams.' }));
    const linksShown = app.vhost ? links.filter((l) => l.vhost === app.vhost) : links;
    replace(linkBox, table([
      { title: 'Virtual host', cell: (l) => l.vhost },
      { title: 'Federated', cls: 'name', cell: (l) => `${l.type} ${l.exchange ?? l.queue}` },
      { title: 'Upstream', cell: (l) => `${l.upstream} (${l.upstream_exchange ?? l.upstream_queue})` },
      { title: 'URI', cell: (l) => h('code', {}, l.uri) },
      { title: 'State', cell: (l) => h(`span.state.${l.status}`, { title: l.timestamp }, l.status) },
      { title: 'Error', cls: 'wrap', cell: (l) => l.error ?? '' },
      { title: 'Reconnects', num: true, cell: (l) => num(l.reconnects) },
      { title: 'Received', num: true, cell: (l) => num(l.messages_received) },
      { title: 'Confirmed', num: true, cell: (l) => num(l.messages_confirmed) },
      { title: 'Redelivered', num: true, cell: (l) => num(l.messages_redelivered) },
      { title: 'Node', cell: (l) => l.node },
      { title: '', cell: (l) => h('button.small', { type: 'button', name: 'restart-link', onclick: () => restart(l) }, 'Restart') },
    ], linksShown, { empty: 'No federation links: a policy with federation-upstream or federation-upstream-set starts them.' }));
  }

  async function remove(upstream) {
    if (!await confirmAction(`Delete upstream "${upstream.name}" in ${upstream.vhost}? Its links stop.`)) return;
    if (await act(() => del(api`/api/parameters/federation-upstream/${upstream.vhost}/${upstream.name}`), `Upstream ${upstream.name} deleted.`, 'Delete upstream')) {
      await refresh().catch(showError);
    }
  }

  async function restart(link) {
    if (await act(() => del(api`/api/federation-links/vhost/${link.vhost}/${link.id}/${link.node}/restart`), 'Link restarting.', 'Restart link')) {
      await refresh().catch(showError);
    }
  }

  const vhost = select('upstream-vhost', app.vhostChoices(), app.vhost);
  const name = textInput('upstream-name', { required: true });
  const uri = textInput('upstream-uri', { required: true, placeholder: 'amqp://user:password@host:5672/vhost' });
  const exchange = textInput('upstream-exchange', { placeholder: 'the federated exchange\'s own name' });
  const queue = textInput('upstream-queue', { placeholder: 'the federated queue\'s own name' });
  const prefetch = h('input', { type: 'number', name: 'upstream-prefetch', placeholder: '1000' });
  const delay = h('input', { type: 'number', name: 'upstream-reconnect-delay', placeholder: '5 (seconds)' });
  const maxHops = h('input', { type: 'number', name: 'upstream-max-hops', placeholder: '1' });
  const expires = h('input', { type: 'number', name: 'upstream-expires', placeholder: 'upstream queue expiry (ms)' });
  const ttl = h('input', { type: 'number', name: 'upstream-message-ttl', placeholder: 'upstream queue message TTL (ms)' });
  const ackMode = select('upstream-ack-mode', ACK_MODES, 'on-confirm');
  const addUpstream = form('stacked', [field('Virtual host', vhost), field('Name', name), field('URI', uri),
    field('Exchange', exchange), field('Queue', queue), field('Prefetch count', prefetch), field('Reconnect delay', delay),
    field('Max hops', maxHops), field('Expires', expires), field('Message TTL', ttl), field('Ack mode', ackMode)], async () => {
    const value = { uri: uri.value, 'ack-mode': ackMode.value };
    for (const [key, input] of [['exchange', exchange], ['queue', queue]]) if (input.value) value[key] = input.value;
    for (const [key, input] of [['prefetch-count', prefetch], ['reconnect-delay', delay], ['max-hops', maxHops], ['expires', expires], ['message-ttl', ttl]]) {
      if (input.value !== '') value[key] = Number(input.value);
    }
    await put(api`/api/parameters/federation-upstream/${vhost.value}/${name.value}`, { value });
    showOk(`Upstream ${name.value} set in ${vhost.value}.`);
    await refresh();
  }, 'Set upstream');

  return {
    el: h('div', {},
      h('div.panel', {}, h('h2', {}, 'Federation links'), linkBox),
      h('div.panel', {}, h('h2', {}, 'Federation upstreams'), upstreamBox),
      h('div.panel', {}, h('h3', {}, 'Add or update an upstream'), addUpstream)),
    refresh,
  };
}

// The URI without its password, as the status shows it.
function redacted(uri) {
  return String(uri).replace(/\/\/([^:@/]*):[^@/]*@/, '//$1:***@');
}
