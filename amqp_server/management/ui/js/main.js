// The UI's shell: login, the header (navigation, vhost selector, refresh interval, logout), the
// hash router, and polling. Each page module exports `render(app)` returning
// {el, refresh?, destroy?}; refresh() runs at once and then every refresh interval, like
// RabbitMQ's UI (5 s by default, changeable in the header).

import { h, replace } from './dom.js';
import { get, post, del, setSession, ApiError } from './api.js';
import { setNoticeBox, showError, clearErrors } from './widgets.js';
import * as overview from './pages/overview.js';
import * as connections from './pages/connections.js';
import * as channels from './pages/channels.js';
import * as exchanges from './pages/exchanges.js';
import * as queues from './pages/queues.js';
import * as admin from './pages/admin.js';

const ROUTES = [
  // [pattern, module, page name, section in the navigation]
  [/^\/?$/, overview.render, 'overview'],
  [/^\/connections$/, connections.renderList, 'connections'],
  [/^\/connections\/([^/]+)$/, connections.renderDetail, 'connections'],
  [/^\/channels$/, channels.renderList, 'channels'],
  [/^\/channels\/([^/]+)$/, channels.renderDetail, 'channels'],
  [/^\/exchanges$/, exchanges.renderList, 'exchanges'],
  [/^\/exchanges\/([^/]+)\/([^/]+)$/, exchanges.renderDetail, 'exchanges'],
  [/^\/queues$/, queues.renderList, 'queues'],
  [/^\/queues\/([^/]+)\/([^/]+)$/, queues.renderDetail, 'queues'],
  [/^\/admin(?:\/([a-z-]+))?$/, admin.render, 'admin'],
];
const NAV = [['overview', 'Overview', '#/'], ['connections', 'Connections', '#/connections'],
  ['channels', 'Channels', '#/channels'], ['exchanges', 'Exchanges', '#/exchanges'], ['queues', 'Queues', '#/queues'],
  ['admin', 'Admin', '#/admin']];
const INTERVALS = [[2000, 'every 2 s'], [5000, 'every 5 s'], [10000, 'every 10 s'], [30000, 'every 30 s'], [60000, 'every 60 s'], [0, 'paused']];
const ALL_VHOSTS = '';

// What pages may use: the user, the selected vhost, the vhost names, navigation.
const app = {
  user: null,
  vhosts: [],
  vhost: localStorage.getItem('amqp-ui-vhost') ?? ALL_VHOSTS,
  interval: Number(localStorage.getItem('amqp-ui-interval') ?? 5000),
  isAdmin() { return this.user?.tags.includes('administrator'); },
  isMonitor() { return this.isAdmin() || this.user?.tags.includes('monitoring'); },
  // Policymakers manage policies in their vhosts, as in RabbitMQ (the Admin tab shows them that part).
  isPolicymaker() { return this.isAdmin() || this.user?.tags.includes('policymaker'); },
  go(hash) { window.location.hash = hash; },
  // The vhosts a form may offer: the selected one first.
  vhostChoices() { return this.vhost ? [this.vhost, ...this.vhosts.filter((v) => v !== this.vhost)] : this.vhosts; },
};

let current = null; // the page on screen: {el, refresh, destroy}
let timer = null;
let shell = null;

function root() {
  return document.getElementById('app');
}

// ---- login ---------------------------------------------------------------------------------

function showLogin(message) {
  stopPage();
  setSession(null);
  shell = null;
  app.user = null;
  const problem = h('div.login-problem');
  if (message) problem.append(h('div.notice.error', { role: 'alert' }, message));
  const username = h('input', { type: 'text', name: 'username', autocomplete: 'username', required: true, autofocus: true });
  const password = h('input', { type: 'password', name: 'password', autocomplete: 'current-password' });
  const submit = h('button.primary', { type: 'submit' }, 'Log in');
  const form = h('form', {}, h('label', {}, 'Username', username), h('label', {}, 'Password', password), submit, problem);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    submit.disabled = true;
    problem.replaceChildren();
    try {
      const session = await post('/api/amqp-server/session', { username: username.value, password: password.value });
      await startSession(session);
    } catch (error) {
      problem.append(h('div.notice.error', { role: 'alert' }, error instanceof ApiError ? error.describe() : error.message));
    } finally {
      submit.disabled = false;
    }
  });
  replace(root(), h('div.login', {}, h('h1', {}, 'amqp', h('span', {}, '-server'), ' management'), form));
  username.focus();
}

async function startSession(session) {
  app.user = { name: session.name, tags: session.tags };
  setSession(session.csrf_token, () => showLogin('Your session has ended (logged out, expired, or the user changed). Log in again.'));
  await loadVhosts();
  buildShell();
  route();
}

async function loadVhosts() {
  try {
    const vhosts = await get('/api/vhosts?columns=name');
    app.vhosts = vhosts.map((v) => v.name);
  } catch (error) {
    app.vhosts = [];
    showError(error, 'Listing virtual hosts');
  }
  if (app.vhost && !app.vhosts.includes(app.vhost)) app.vhost = ALL_VHOSTS;
}

async function logout() {
  try {
    await del('/api/amqp-server/session');
  } catch (error) {
    // The session may already be gone; the login form is what follows either way.
  }
  showLogin();
}

// ---- the shell -----------------------------------------------------------------------------

function buildShell() {
  const nav = h('nav.main', {}, NAV.filter(([name]) => name !== 'admin' || app.isPolicymaker())
    .map(([name, label, href]) => h('a', { href, dataset: { page: name } }, label)));
  const vhostSelect = h('select', { name: 'vhost', onchange: () => {
    app.vhost = vhostSelect.value;
    localStorage.setItem('amqp-ui-vhost', app.vhost);
    route();
  } });
  const intervalSelect = h('select', { name: 'refresh', onchange: () => {
    app.interval = Number(intervalSelect.value);
    localStorage.setItem('amqp-ui-interval', String(app.interval));
    schedule();
  } }, INTERVALS.map(([ms, label]) => h('option', { value: String(ms), selected: ms === app.interval }, label)));
  const notices = h('div.notices');
  setNoticeBox(notices);
  const pageBox = h('div.page');
  shell = { nav, pageBox, vhostSelect };
  showVhostChoices();
  replace(root(),
    h('header.top', {},
      h('a.brand', { href: '#/' }, 'amqp', h('span', {}, '-server')),
      nav,
      h('div.session', {},
        h('label', {}, 'Virtual host', vhostSelect),
        h('label', {}, 'Refresh', intervalSelect),
        h('span.who', { title: 'Logged in user and tags' }, app.user.name, ' ', h('span.tags', {}, `(${app.user.tags.join(', ') || 'no tags'})`)),
        h('button.small', { type: 'button', name: 'logout', onclick: logout }, 'Log out'))),
    h('main', {}, notices, pageBox));
}

function showVhostChoices() {
  replace(shell.vhostSelect, h('option', { value: ALL_VHOSTS }, 'All'),
    app.vhosts.map((name) => h('option', { value: name, selected: name === app.vhost }, name)));
}

// Vhosts come and go (the Admin page, other operators): the selector follows at each page change.
async function followVhosts() {
  const before = app.vhosts.join('\n');
  await loadVhosts();
  if (shell && app.vhosts.join('\n') !== before) showVhostChoices();
}

// ---- routing and polling -------------------------------------------------------------------

function stopPage() {
  clearTimeout(timer);
  timer = null;
  current?.destroy?.();
  current = null;
}

function route() {
  if (!shell) return;
  stopPage();
  clearErrors();
  followVhosts();
  const path = window.location.hash.replace(/^#/, '') || '/';
  for (const [pattern, render, name] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    let params;
    try {
      params = match.slice(1).map((part) => (part === undefined ? undefined : decodeURIComponent(part)));
    } catch (error) {
      break; // a malformed %-escape: no such page
    }
    for (const link of shell.nav.querySelectorAll('a')) link.classList.toggle('active', link.dataset.page === name);
    current = render(app, ...params);
    replace(shell.pageBox, current.el);
    refreshNow();
    return;
  }
  replace(shell.pageBox, h('p', {}, `No page at ${path}.`));
}

async function refreshNow() {
  const page = current;
  if (!page?.refresh) return;
  try {
    await page.refresh();
  } catch (error) {
    if (page === current) showError(error);
  }
  if (page === current) schedule();
}

function schedule() {
  clearTimeout(timer);
  if (app.interval > 0 && current?.refresh) {
    timer = setTimeout(() => {
      if (document.hidden) schedule(); else refreshNow();
    }, app.interval);
  }
}

window.addEventListener('hashchange', route);

// ---- start ---------------------------------------------------------------------------------

async function start() {
  try {
    const session = await get('/api/amqp-server/session');
    if (!session.csrf_token) throw new ApiError(401, 'not_authorized', 'Login failed');
    await startSession(session);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) showLogin();
    else showLogin(error instanceof ApiError ? error.describe() : error.message);
  }
}

start();
