// Channels: the paged list, and a channel's page with prefetch, unacked, confirm mode and its
// consumers.

import { h, replace, num, jsonText, seg } from '../dom.js';
import { get, api } from '../api.js';
import { PagedList, table, kvTable } from '../widgets.js';
import { connectionHref } from './connections.js';

function mode(channel) {
  return [channel.confirm ? h('span.badge', { title: 'Publisher confirms on' }, 'C') : null,
    channel.transactional ? h('span.badge', { title: 'Transactional' }, 'T') : null];
}

export function renderList(app) {
  const list = new PagedList({
    path: () => '/api/channels',
    columns: [
      { title: 'Channel', sort: 'name', cls: 'name', cell: (c) => h('a', { href: `#/channels/${seg(c.name)}` }, c.name) },
      { title: 'User', sort: 'user', cell: (c) => c.user },
      { title: 'Virtual host', sort: 'vhost', cell: (c) => c.vhost ?? '–' },
      { title: 'Mode', cell: mode },
      { title: 'State', sort: 'state', cell: (c) => c.state },
      { title: 'Consumers', num: true, sort: 'consumer_count', cell: (c) => num(c.consumer_count) },
      { title: 'Prefetch', num: true, sort: 'prefetch_count', cell: (c) => num(c.prefetch_count) },
      { title: 'Unacked', num: true, sort: 'messages_unacknowledged', cell: (c) => num(c.messages_unacknowledged) },
      { title: 'Unconfirmed', num: true, sort: 'messages_unconfirmed', cell: (c) => num(c.messages_unconfirmed) },
    ],
    empty: 'No channels.',
  });
  const el = h('div', {}, h('div.page-head', {}, h('h1', {}, 'Channels')), h('div.panel', {}, list.el));
  return { el, refresh: () => list.refresh() };
}

export function renderDetail(app, name) {
  const details = h('div');
  const consumers = h('div');

  async function refresh() {
    const [channel, allConsumers] = await Promise.all([get(api`/api/channels/${name}`), get('/api/consumers')]);
    replace(details, kvTable([
      ['Connection', h('a', { href: connectionHref(channel.connection_details.name) }, channel.connection_details.name)],
      ['Number', String(channel.number)], ['User', channel.user], ['Virtual host', channel.vhost ?? '–'],
      ['State', channel.state],
      ['Confirm mode', channel.confirm ? 'on' : 'off'], ['Transactional', channel.transactional ? 'yes' : 'no'],
      ['Prefetch (per consumer)', num(channel.prefetch_count)], ['Prefetch (global)', num(channel.global_prefetch_count)],
      ['Unacked', num(channel.messages_unacknowledged)], ['Unconfirmed', num(channel.messages_unconfirmed)],
      ['Uncommitted messages', num(channel.messages_uncommitted)], ['Uncommitted acks', num(channel.acks_uncommitted)],
    ]));
    replace(consumers, table([
      { title: 'Consumer tag', cls: 'wrap', cell: (c) => c.consumer_tag },
      { title: 'Queue', cls: 'name', cell: (c) => h('a', { href: `#/queues/${seg(c.queue.vhost)}/${seg(c.queue.name)}` }, c.queue.name) },
      { title: 'Ack required', cell: (c) => (c.ack_required ? 'yes' : 'no') },
      { title: 'Prefetch', num: true, cell: (c) => num(c.prefetch_count) },
      { title: 'Exclusive', cell: (c) => (c.exclusive ? 'yes' : 'no') },
      { title: 'Arguments', cls: 'wrap', cell: (c) => h('code', {}, jsonText(c.arguments)) },
    ], allConsumers.filter((c) => c.channel_details.name === name), { empty: 'No consumers on this channel.' }));
  }

  const el = h('div', {},
    h('div.page-head', {}, h('h1', {}, 'Channel ', h('span.mono', {}, name))),
    h('div.panel', {}, h('h2', {}, 'Details'), details),
    h('div.panel', {}, h('h2', {}, 'Consumers'), consumers));
  return { el, refresh };
}
