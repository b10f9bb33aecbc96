// Exchanges: the paged list, adding one, and an exchange's page with its bindings (both
// directions), binding, publishing and deleting.

import { h, replace, jsonText } from '../dom.js';
import { get, put, del, api } from '../api.js';
import {
  PagedList, kvTable, form, field, textInput, select, checkbox, parseObject, section, exchangeFeatures,
  confirmAction, act, showOk,
} from '../widgets.js';
import { bindingsTable, bindingForm, publishForm, exchangeHref } from './shared.js';

const TYPES = ['direct', 'fanout', 'topic', 'headers', 'x-delayed-message'];

export function renderList(app) {
  const list = new PagedList({
    path: () => (app.vhost ? api`/api/exchanges/${app.vhost}` : '/api/exchanges'),
    columns: [
      app.vhost ? null : { title: 'Virtual host', sort: 'vhost', cell: (e) => e.vhost },
      { title: 'Name', sort: 'name', cls: 'name', cell: (e) => h('a', { href: exchangeHref(e.vhost, e.name) }, e.name || '(AMQP default)') },
      { title: 'Type', sort: 'type', cell: (e) => e.type },
      { title: 'Features', cell: (e) => exchangeFeatures(e) },
    ].filter(Boolean),
    columnsParam: 'name,vhost,type,durable,auto_delete,internal,arguments,policy',
    empty: 'No exchanges.',
  });
  const el = h('div', {},
    h('div.page-head', {}, h('h1', {}, 'Exchanges'), h('span.muted', {}, app.vhost ? `in virtual host ${app.vhost}` : 'in all virtual hosts')),
    h('div.panel', {}, list.el),
    section('Add an exchange', addExchangeForm(app, () => list.refresh())));
  return { el, refresh: () => list.refresh() };
}

function addExchangeForm(app, done) {
  const vhost = select('vhost', app.vhostChoices(), app.vhost);
  const name = textInput('name', { required: true });
  const type = select('type', TYPES, 'direct');
  const durable = checkbox('durable', 'Durable', true);
  const autoDelete = checkbox('auto_delete', 'Auto-delete');
  const internal = checkbox('internal', 'Internal');
  const args = h('textarea', { name: 'arguments', placeholder: '{"alternate-exchange": "unrouted"}' });
  return form('stacked', [
    field('Virtual host', vhost), field('Name', name), field('Type', type),
    field('Options', h('div.checks', {}, durable.el, autoDelete.el, internal.el)),
    field('Arguments (JSON)', args),
  ], async () => {
    await put(api`/api/exchanges/${vhost.value}/${name.value}`, { type: type.value, durable: durable.box.checked,
      auto_delete: autoDelete.box.checked, internal: internal.box.checked, arguments: parseObject(args.value, 'Arguments') });
    showOk(`Exchange ${name.value} declared in ${vhost.value}.`);
    name.value = '';
    await done();
  }, 'Add exchange');
}

export function renderDetail(app, vhost, name) {
  const isDefault = name === 'amq.default';
  const base = api`/api/exchanges/${vhost}/${name}`;
  const details = h('div');
  const outgoing = h('div');
  const incoming = h('div');

  async function refresh() {
    const [exchange, source, destination] = await Promise.all([get(base), get(`${base}/bindings/source`), get(`${base}/bindings/destination`)]);
    replace(details, kvTable([
      ['Virtual host', exchange.vhost], ['Type', exchange.type], ['Features', exchangeFeatures(exchange)],
      ['Arguments', h('code', {}, jsonText(exchange.arguments))], ['Policy', exchange.policy || '–'],
    ]));
    replace(outgoing, bindingsTable(source, { vhost, onChange: refresh, showSource: false }));
    replace(incoming, bindingsTable(destination, { vhost, onChange: refresh, showDestination: false }));
  }

  const remove = h('button.danger', { type: 'button', name: 'delete', onclick: async () => {
    if (!await confirmAction(`Delete exchange "${name}" in ${vhost} and its bindings?`)) return;
    if (await act(() => del(base), `Exchange ${name} deleted.`, 'Delete')) app.go('#/exchanges');
  } }, 'Delete exchange');

  const el = h('div', {},
    h('div.page-head', {}, h('h1', {}, 'Exchange ', h('span.mono', {}, isDefault ? '(AMQP default)' : name)), h('span.muted', {}, `in virtual host ${vhost}`)),
    h('div.panel', {}, h('h2', {}, 'Details'), details),
    h('div.panel', {}, h('h2', {}, 'Bindings from this exchange'), outgoing,
      isDefault ? h('p.muted', {}, 'The default exchange routes to the queue named by the routing key; it takes no other bindings.')
        : [h('h3', {}, 'Add a binding from this exchange'), bindingForm(app, { vhost, source: name, onDone: refresh })]),
    h('div.panel', {}, h('h2', {}, 'Bindings to this exchange'), incoming),
    section('Publish a message', publishForm({ vhost, exchange: name, onDone: refresh })),
    isDefault || name.startsWith('amq.') ? null : section('Delete', h('div.actions', {}, remove)));
  return { el, refresh };
}
