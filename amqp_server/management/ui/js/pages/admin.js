// Admin (administrators): users and their permissions, virtual hosts with their limits and
// firehose tracing, policies, feature flags, and definitions export (download) and import
// (upload).

import { h, replace, num, jsonText } from '../dom.js';
import { get, put, del, request, api } from '../api.js';
import { table, form, field, textInput, select, checkbox, parseObject, section, confirmAction, act, showOk, showError } from '../widgets.js';
import { federation } from './federation.js';

const TABS = [['users', 'Users'], ['vhosts', 'Virtual hosts'], ['policies', 'Policies and limits'],
  ['federation', 'Federation'], ['features', 'Feature flags'], ['definitions', 'Definitions']];
const TAGS = ['administrator', 'monitoring', 'policymaker', 'management'];

export function render(app, tab) {
  if (!app.isPolicymaker()) {
    return { el: h('div', {}, h('h1', {}, 'Admin'), h('p', {}, 'The admin pages are for users tagged administrator (or policymaker, for policies).')) };
  }
  // A policymaker gets the policies tab only; the API decides what it may change there.
  const tabs = app.isAdmin() ? TABS : TABS.filter(([name]) => name === 'policies');
  const chosen = tabs.some(([name]) => name === tab) ? tab : tabs[0][0];
  const nav = h('div.subnav', {}, tabs.map(([name, label]) => h('a', { href: `#/admin/${name}`, class: name === chosen ? 'active' : null }, label)));
  const page = { users, vhosts, policies, federation, features, definitions }[chosen];
  const body = page(app);
  return { el: h('div', {}, h('div.page-head', {}, h('h1', {}, 'Admin')), nav, body.el), refresh: body.refresh };
}

// ---- users and permissions -----------------------------------------------------------------

function tagChecks(selected = []) {
  const boxes = TAGS.map((tag) => checkbox(`tag-${tag}`, tag, selected.includes(tag)));
  const other = textInput('other-tags', { placeholder: 'other tags, comma-separated', value: selected.filter((t) => !TAGS.includes(t)).join(',') });
  return {
    el: h('div.checks', {}, boxes.map((b) => b.el), other),
    value: () => [...TAGS.filter((tag, i) => boxes[i].box.checked), ...other.value.split(',').map((t) => t.trim()).filter(Boolean)],
  };
}

function users(app) {
  const userTable = h('div');
  const permissionTable = h('div');
  const editBox = h('div');
  const userSelects = [];
  let userNames = [];

  async function refresh() {
    const [userList, permissions] = await Promise.all([get('/api/users'), get('/api/permissions')]);
    userNames = userList.map((u) => u.name);
    for (const choice of userSelects) {
      const kept = choice.value;
      replace(choice, userNames.map((name) => h('option', { value: name, selected: name === kept }, name)));
    }
    replace(userTable, table([
      { title: 'Name', cls: 'name', cell: (u) => u.name },
      { title: 'Tags', cell: (u) => u.tags.join(', ') || h('span.muted', {}, 'none: cannot use the management UI') },
      { title: 'Password', cell: (u) => (u.password_hash ? 'set' : h('span.muted', {}, 'none')) },
      { title: 'Virtual hosts', cls: 'wrap', cell: (u) => permissions.filter((p) => p.user === u.name).map((p) => p.vhost).join(', ') || '–' },
      { title: '', cell: (u) => h('div.actions', {},
        h('button.small', { type: 'button', name: 'edit-user', onclick: () => edit(u) }, 'Edit'),
        h('button.small.danger', { type: 'button', name: 'delete-user', onclick: () => removeUser(u.name) }, 'Delete')) },
    ], userList));
    replace(permissionTable, table([
      { title: 'User', cell: (p) => p.user }, { title: 'Virtual host', cell: (p) => p.vhost },
      { title: 'Configure', cell: (p) => h('code', {}, p.configure) }, { title: 'Write', cell: (p) => h('code', {}, p.write) },
      { title: 'Read', cell: (p) => h('code', {}, p.read) },
      { title: '', cell: (p) => h('button.small.danger', { type: 'button', name: 'clear-permission', onclick: () => clearPermission(p) }, 'Clear') },
    ], permissions, { empty: 'No permissions.' }));
  }

  async function removeUser(name) {
    const self = name === app.user.name ? ' You are logged in as this user: your session ends.' : '';
    if (!await confirmAction(`Delete user "${name}"? Its permissions go too.${self}`)) return;
    if (await act(() => del(api`/api/users/${name}`), `User ${name} deleted.`, 'Delete user')) await refresh().catch(showError);
  }

  async function clearPermission(permission) {
    if (!await confirmAction(`Clear the permissions of ${permission.user} in ${permission.vhost}?`, { confirmLabel: 'Clear' })) return;
    if (await act(() => del(api`/api/permissions/${permission.vhost}/${permission.user}`), 'Permissions cleared.', 'Clear permissions')) {
      await refresh().catch(showError);
    }
  }

  function edit(user) {
    const tags = tagChecks(user.tags);
    const password = h('input', { type: 'password', name: 'new-password', autocomplete: 'new-password' });
    replace(editBox, h('div.panel', {}, h('h2', {}, `Edit user ${user.name}`), form('stacked', [
      field('New password', password, 'Leave empty to keep the current password'),
      field('Tags', tags.el),
    ], async () => {
      const body = { tags: tags.value().join(',') };
      if (password.value) body.password = password.value;
      await put(api`/api/users/${user.name}`, body);
      showOk(`User ${user.name} updated.`);
      replace(editBox);
      await refresh();
    }, 'Update user')));
    editBox.scrollIntoView({ block: 'nearest' });
  }

  const addName = textInput('new-user', { required: true, autocomplete: 'off' });
  const addPassword = h('input', { type: 'password', name: 'new-user-password', autocomplete: 'new-password' });
  const addTags = tagChecks(['management']);
  const addUser = form('stacked', [field('Name', addName), field('Password', addPassword), field('Tags', addTags.el)], async () => {
    await put(api`/api/users/${addName.value}`, { password: addPassword.value, tags: addTags.value().join(',') });
    showOk(`User ${addName.value} added.`);
    addName.value = '';
    addPassword.value = '';
    await refresh();
  }, 'Add user');

  const permissionUser = h('select', { name: 'permission-user' });
  userSelects.push(permissionUser);
  const permissionVhost = select('permission-vhost', app.vhostChoices(), app.vhost);
  const [configure, write, read] = ['configure', 'write', 'read'].map((name) => textInput(name, { value: '.*' }));
  const setPermission = form('stacked', [
    field('User', permissionUser), field('Virtual host', permissionVhost),
    field('Configure regexp', configure), field('Write regexp', write), field('Read regexp', read),
  ], async () => {
    await put(api`/api/permissions/${permissionVhost.value}/${permissionUser.value}`,
      { configure: configure.value, write: write.value, read: read.value });
    showOk(`Permissions of ${permissionUser.value} in ${permissionVhost.value} set.`);
    await refresh();
  }, 'Set permissions');

  return {
    el: h('div', {},
      h('div.panel', {}, h('h2', {}, 'Users'), userTable), editBox,
      h('div.panel', {}, h('h2', {}, 'Add a user'), addUser),
      h('div.panel', {}, h('h2', {}, 'Permissions'), permissionTable, h('h3', {}, 'Set permissions'), setPermission)),
    refresh,
  };
}

// ---- virtual hosts -------------------------------------------------------------------------

function vhosts(app) {
  const vhostTable = h('div');

  async function refresh() {
    const list = await get('/api/vhosts');
    replace(vhostTable, table([
      { title: 'Name', cls: 'name', cell: (v) => v.name },
      { title: 'Description', cls: 'wrap', cell: (v) => v.description || '–' },
      { title: 'Tags', cell: (v) => v.tags.join(', ') || '–' },
      { title: 'Tracing (firehose)', cell: (v) => {
        const box = h('input', { type: 'checkbox', name: 'tracing', checked: v.tracing, onchange: async () => {
          // A vhost PUT replaces description and tags, so send them back unchanged.
          const ok = await act(() => put(api`/api/vhosts/${v.name}`, { description: v.description, tags: v.tags.join(','), tracing: box.checked }),
            `Tracing ${box.checked ? 'on' : 'off'} in ${v.name}: messages are copied to amq.rabbitmq.trace.`, 'Tracing');
          if (!ok) box.checked = !box.checked;
        } });
        return h('label', {}, box, v.tracing ? ' on' : ' off');
      } },
      { title: 'Ready', num: true, cell: (v) => num(v.messages_ready) },
      { title: 'Unacked', num: true, cell: (v) => num(v.messages_unacknowledged) },
      { title: '', cell: (v) => h('button.small.danger', { type: 'button', name: 'delete-vhost', onclick: async () => {
        if (!await confirmAction(`Delete virtual host "${v.name}" with all its queues, exchanges and messages?`)) return;
        if (await act(() => del(api`/api/vhosts/${v.name}`), `Virtual host ${v.name} deleted.`, 'Delete virtual host')) await refresh().catch(showError);
      } }, 'Delete') },
    ], list));
  }

  const name = textInput('vhost-name', { required: true });
  const description = textInput('vhost-description');
  const tags = textInput('vhost-tags', { placeholder: 'comma-separated' });
  const tracing = checkbox('vhost-tracing', 'Trace every message (firehose)');
  const addVhost = form('stacked', [field('Name', name), field('Description', description), field('Tags', tags), field('Tracing', tracing.el)], async () => {
    await put(api`/api/vhosts/${name.value}`, { description: description.value, tags: tags.value, tracing: tracing.box.checked });
    showOk(`Virtual host ${name.value} added; you have full permissions in it.`);
    name.value = '';
    await refresh();
  }, 'Add virtual host');

  return {
    el: h('div', {}, h('div.panel', {}, h('h2', {}, 'Virtual hosts'), vhostTable), h('div.panel', {}, h('h2', {}, 'Add a virtual host'), addVhost)),
    refresh,
  };
}

// ---- policies and limits ---------------------------------------------------------------------

const POLICY_KINDS = [['policies', 'Policy'], ['operator-policies', 'Operator policy']];
const VHOST_LIMITS = ['max-connections', 'max-queues'];
const USER_LIMITS = ['max-connections', 'max-channels'];

function policies(app) {
  const boxes = { policies: h('div'), operator: h('div'), vhostLimits: h('div'), userLimits: h('div') };
  const userChoice = h('select', { name: 'limit-user' });

  const removePolicy = (kind, policy) => async () => {
    if (!await confirmAction(`Delete ${kind === 'policies' ? 'policy' : 'operator policy'} "${policy.name}" in ${policy.vhost}? Queues and exchanges it applies to lose its settings.`)) return;
    if (await act(() => del(api`/api/${kind}/${policy.vhost}/${policy.name}`), `Deleted ${policy.name}.`, 'Delete policy')) await refresh().catch(showError);
  };
  const clearLimit = (path, label) => async () => {
    if (!await confirmAction(`Clear the ${label}?`, { confirmLabel: 'Clear' })) return;
    if (await act(() => del(path), 'Limit cleared.', 'Clear limit')) await refresh().catch(showError);
  };
  const limitCells = (limits, pathOf, who) => Object.entries(limits || {}).map(([name, value]) => h('div', {},
    h('code', {}, `${name}: ${value}`), ' ',
    h('button.small.danger', { type: 'button', name: 'clear-limit', onclick: clearLimit(pathOf(name), `${name} limit of ${who}`) }, 'Clear')));

  async function refresh() {
    const admin = app.isAdmin();
    const [policyList, operatorList, vhostLimits, userLimits, users] = await Promise.all([
      get('/api/policies'), admin ? get('/api/operator-policies') : [], admin ? get('/api/vhost-limits') : [],
      admin ? get('/api/user-limits') : [], admin ? get('/api/users') : []]);
    const policyColumns = (kind) => [
      { title: 'Virtual host', cell: (p) => p.vhost }, { title: 'Name', cls: 'name', cell: (p) => p.name },
      { title: 'Pattern', cell: (p) => h('code', {}, p.pattern) }, { title: 'Apply to', cell: (p) => p['apply-to'] },
      { title: 'Definition', cls: 'wrap', cell: (p) => h('code', {}, jsonText(p.definition)) },
      { title: 'Priority', num: true, cell: (p) => num(p.priority) },
      { title: '', cell: (p) => h('button.small.danger', { type: 'button', name: 'delete-policy', onclick: removePolicy(kind, p) }, 'Delete') },
    ];
    replace(boxes.policies, table(policyColumns('policies'), policyList, { empty: 'No policies.' }));
    replace(boxes.operator, table(policyColumns('operator-policies'), operatorList, { empty: 'No operator policies.' }));
    replace(boxes.vhostLimits, table([{ title: 'Virtual host', cell: (l) => l.vhost },
      { title: 'Limits', cell: (l) => limitCells(l.value, (name) => api`/api/vhost-limits/${l.vhost}/${name}`, `virtual host ${l.vhost}`) }],
    vhostLimits, { empty: 'No virtual host limits.' }));
    replace(boxes.userLimits, table([{ title: 'User', cell: (l) => l.user },
      { title: 'Limits', cell: (l) => limitCells(l.value, (name) => api`/api/user-limits/${l.user}/${name}`, `user ${l.user}`) }],
    userLimits, { empty: 'No user limits.' }));
    const kept = userChoice.value;
    replace(userChoice, users.map((u) => h('option', { value: u.name, selected: u.name === kept }, u.name)));
  }

  const kind = select('policy-kind', POLICY_KINDS, 'policies');
  const vhost = select('policy-vhost', app.vhostChoices(), app.vhost);
  const name = textInput('policy-name', { required: true });
  const pattern = textInput('policy-pattern', { required: true, placeholder: '^orders\\.' });
  const applyTo = select('policy-apply-to', [['all', 'Exchanges and queues'], ['queues', 'Queues'], ['exchanges', 'Exchanges']], 'all');
  const priority = h('input', { type: 'number', name: 'policy-priority', value: '0' });
  const definition = h('textarea', { name: 'policy-definition', placeholder: '{"max-length": 10000, "dead-letter-exchange": "dlx"}' });
  const addPolicy = form('stacked', [field('Kind', kind), field('Virtual host', vhost), field('Name', name), field('Pattern (regexp)', pattern),
    field('Apply to', applyTo), field('Priority', priority), field('Definition (JSON)', definition)], async () => {
    await put(api`/api/${kind.value}/${vhost.value}/${name.value}`, { pattern: pattern.value, 'apply-to': applyTo.value,
      priority: Number(priority.value || 0), definition: parseObject(definition.value, 'Definition') });
    showOk(`Policy ${name.value} set in ${vhost.value}.`);
    await refresh();
  }, 'Set policy');

  const limitVhost = select('limit-vhost', app.vhostChoices(), app.vhost);
  const vhostLimit = select('vhost-limit', VHOST_LIMITS, VHOST_LIMITS[0]);
  const vhostValue = h('input', { type: 'number', name: 'vhost-limit-value', required: true, placeholder: '-1 for no limit' });
  const setVhostLimit = form('stacked', [field('Virtual host', limitVhost), field('Limit', vhostLimit), field('Value', vhostValue)], async () => {
    await put(api`/api/vhost-limits/${limitVhost.value}/${vhostLimit.value}`, { value: Number(vhostValue.value) });
    showOk(`${vhostLimit.value} of ${limitVhost.value} set to ${vhostValue.value}.`);
    await refresh();
  }, 'Set virtual host limit');

  const userLimit = select('user-limit', USER_LIMITS, USER_LIMITS[0]);
  const userValue = h('input', { type: 'number', name: 'user-limit-value', required: true, placeholder: '-1 for no limit' });
  const setUserLimit = form('stacked', [field('User', userChoice), field('Limit', userLimit), field('Value', userValue)], async () => {
    await put(api`/api/user-limits/${userChoice.value}/${userLimit.value}`, { value: Number(userValue.value) });
    showOk(`${userLimit.value} of ${userChoice.value} set to ${userValue.value}.`);
    await refresh();
  }, 'Set user limit');

  // Operator policies and limits are the administrators' (RabbitMQ's rule); a policymaker has its vhosts' policies.
  const admin = app.isAdmin();
  if (!admin) kind.replaceChildren(h('option', { value: 'policies' }, 'Policy'));
  return {
    el: h('div', {},
      h('div.panel', {}, h('h2', {}, 'Policies'), boxes.policies),
      admin ? h('div.panel', {}, h('h2', {}, 'Operator policies'), boxes.operator) : null,
      section('Add or update a policy', addPolicy),
      admin ? h('div.grid', {},
        h('div.panel', {}, h('h2', {}, 'Virtual host limits'), boxes.vhostLimits, h('h3', {}, 'Set a limit'), setVhostLimit),
        h('div.panel', {}, h('h2', {}, 'User limits'), boxes.userLimits, h('h3', {}, 'Set a limit'), setUserLimit)) : null),
    refresh,
  };
}

// ---- feature flags -------------------------------------------------------------------------

function features() {
  const flags = h('div');
  return {
    el: h('div', {}, h('div.panel', {}, h('h2', {}, 'Feature flags'), flags,
      h('p.muted', {}, 'Firehose tracing is switched per virtual host on the Virtual hosts tab.'))),
    async refresh() {
      replace(flags, table([
        { title: 'Name', cell: (f) => h('code', {}, f.name) }, { title: 'State', cell: (f) => f.state },
        { title: 'Description', cls: 'wrap', cell: (f) => f.desc }, { title: 'Provided by', cell: (f) => f.provided_by },
      ], await get('/api/feature-flags')));
    },
  };
}

// ---- definitions ---------------------------------------------------------------------------

function definitions(app) {
  const ALL = '';
  const exportScope = select('export-vhost', [[ALL, 'All (users, vhosts, permissions, topology)'], ...app.vhosts.map((v) => [v, `Virtual host ${v} only`])], ALL);
  const download = h('button.primary', { type: 'button', name: 'export', onclick: async () => {
    const path = exportScope.value ? api`/api/definitions/${exportScope.value}` : '/api/definitions';
    try {
      const text = await request('GET', path, { text: true });
      const link = h('a', { href: URL.createObjectURL(new Blob([text], { type: 'application/json' })), download: definitionsFileName(exportScope.value) });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10000);
      showOk('Definitions exported.');
    } catch (error) {
      showError(error, 'Export');
    }
  } }, 'Download broker definitions');

  const file = h('input', { type: 'file', name: 'definitions-file', accept: '.json,application/json', required: true });
  const importScope = select('import-vhost', [[ALL, 'All: as the file says'], ...app.vhosts.map((v) => [v, `Into virtual host ${v}`])], ALL);
  const upload = form('stacked', [field('Definitions file', file), field('Import into', importScope)], async () => {
    const chosen = file.files[0];
    if (!chosen) throw new Error('Choose a definitions file first.');
    const text = await chosen.text();
    try {
      JSON.parse(text);
    } catch (error) {
      throw new Error(`${chosen.name} is not JSON: ${error.message}`);
    }
    if (!await confirmAction(`Import ${chosen.name}? Users in it get its passwords and tags; queues, exchanges and bindings in it are declared.`, { confirmLabel: 'Import' })) return;
    const path = importScope.value ? api`/api/definitions/${importScope.value}` : '/api/definitions';
    await request('POST', path, { body: text });
    showOk(`Definitions imported from ${chosen.name}.`);
  }, 'Upload broker definitions');

  return {
    el: h('div', {},
      h('div.panel', {}, h('h2', {}, 'Export definitions'), h('p.muted', {}, 'Users (with password hashes), virtual hosts, permissions, exchanges, queues and bindings, as RabbitMQ exports them.'),
        h('form.inline', {}, exportScope, download)),
      h('div.panel', {}, h('h2', {}, 'Import definitions'), h('p.muted', {}, 'A RabbitMQ or amqp-server export. The first thing the broker refuses stops the import.'), upload)),
  };
}

function definitionsFileName(vhost) {
  const date = new Date().toISOString().slice(0, 10);
  return vhost ? `definitions-${vhost.replace(/[^A-Za-z0-9._-]/g, '_')}-${date}.json` : `definitions-${date}.json`;
}
