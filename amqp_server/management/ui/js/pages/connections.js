// Connections: the paged list with client, user, vhost, TLS and traffic rates; a connection's
// page with its client properties and channels, and closing it with a reason.

import { h, replace, num, rate, rateOf, bytes, when, jsonText, seg } from '../dom.js';
import { get, del, api } from '../api.js';
import { PagedList, table, kvTable, confirmAction, act } from '../widgets.js';

function client(properties) {
  if (!properties) return '–';
  return [properties.product, properties.version].filter(Boolean).join(' ') || '–';
}

function tls(connection) {
  return connection.ssl ? `${connection.ssl_protocol || 'TLS'}` : 'no';
}

export function connectionHref(name) {
  return `#/connections/${seg(name)}`;
}

export function renderList(app) {
  const list = new PagedList({
    path: () => '/api/connections',
    columns: [
      { title: 'Name', sort: 'name', cls: 'name', cell: (c) => [h('a', { href: connectionHref(c.name) }, c.name),
        c.user_provided_name ? h('div.muted', {}, c.user_provided_name) : null] },
      { title: 'User', sort: 'user', cell: (c) => c.user },
      { title: 'Virtual host', sort: 'vhost', cell: (c) => c.vhost ?? '–' },
      { title: 'State', sort: 'state', cell: (c) => h(`span.state-${c.state}`, {}, c.state) },
      { title: 'TLS', sort: 'ssl', cell: tls },
      { title: 'Client', cell: (c) => client(c.client_properties) },
      { title: 'Channels', num: true, sort: 'channels', cell: (c) => num(c.channels) },
      { title: 'From client', num: true, sort: 'recv_oct_details.rate', cell: (c) => `${bytes(rateOf(c, 'recv_oct'))}/s` },
      { title: 'To client', num: true, sort: 'send_oct_details.rate', cell: (c) => `${bytes(rateOf(c, 'send_oct'))}/s` },
    ],
    empty: 'No connections.',
  });
  const el = h('div', {}, h('div.page-head', {}, h('h1', {}, 'Connections')), h('div.panel', {}, list.el));
  return { el, refresh: () => list.refresh() };
}

function propertyRows(properties) {
  return Object.entries(properties || {}).map(([key, value]) => [key, typeof value === 'object' && value !== null
    ? kvTable(Object.entries(value).map(([k, v]) => [k, jsonText(v)])) : jsonText(value)]);
}

export function renderDetail(app, name) {
  const base = api`/api/connections/${name}`;
  const details = h('div');
  const properties = h('div');
  const channels = h('div');

  async function refresh() {
    const [connection, channelList] = await Promise.all([get(base), get(`${base}/channels`)]);
    replace(details, kvTable([
      ['User', connection.user], ['Virtual host', connection.vhost ?? '–'],
      ['State', h(`span.state-${connection.state}`, {}, connection.state)],
      ['Client address', `${connection.peer_host}:${connection.peer_port}`],
      ['Protocol', connection.protocol], ['Authentication', connection.auth_mechanism ?? '–'],
      ['TLS', connection.ssl ? `${connection.ssl_protocol}, ${connection.ssl_cipher}` : 'no'],
      connection.peer_cert_subject ? ['Client certificate', connection.peer_cert_subject] : null,
      ['Heartbeat', `${connection.timeout} s`], ['Frame max', `${num(connection.frame_max)} bytes`],
      ['Channel max', num(connection.channel_max)], ['Connected at', when(connection.connected_at)],
      ['Received', `${bytes(connection.recv_oct)} (${bytes(rateOf(connection, 'recv_oct'))}/s)`],
      ['Sent', `${bytes(connection.send_oct)} (${bytes(rateOf(connection, 'send_oct'))}/s)`],
    ]));
    replace(properties, kvTable(propertyRows(connection.client_properties)));
    replace(channels, table([
      { title: 'Channel', cls: 'name', cell: (c) => h('a', { href: `#/channels/${seg(c.name)}` }, c.name) },
      { title: 'Mode', cell: (c) => [c.confirm ? 'confirm' : null, c.transactional ? 'transactional' : null].filter(Boolean).join(', ') || '–' },
      { title: 'Prefetch', num: true, cell: (c) => num(c.prefetch_count) },
      { title: 'Unacked', num: true, cell: (c) => num(c.messages_unacknowledged) },
      { title: 'Consumers', num: true, cell: (c) => num(c.consumer_count) },
    ], channelList, { empty: 'No channels.' }));
  }

  const close = h('button.danger', { type: 'button', name: 'close-connection', onclick: async () => {
    const reason = await confirmAction(`Close connection ${name}? The client is told the reason (320 CONNECTION_FORCED).`, {
      confirmLabel: 'Close connection', input: { label: 'Reason', value: 'Closed via management UI' } });
    if (reason === null) return;
    if (await act(() => del(base, { 'X-Reason': reason }), `Connection ${name} closed.`, 'Close connection')) app.go('#/connections');
  } }, 'Close this connection');

  const el = h('div', {},
    h('div.page-head', {}, h('h1', {}, 'Connection ', h('span.mono', {}, name))),
    h('div.grid', {},
      h('div.panel', {}, h('h2', {}, 'Details'), details),
      h('div.panel', {}, h('h2', {}, 'Client properties'), properties)),
    h('div.panel', {}, h('h2', {}, 'Channels'), channels),
    h('div.panel', {}, h('h2', {}, 'Close'), close));
  return { el, refresh };
}
