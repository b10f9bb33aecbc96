// Building blocks the pages share: notices, the confirmation dialog, tables, the paged list,
// form helpers, queue feature badges and the line chart.

import { h, add, replace, num } from './dom.js';
import { get, ApiError } from './api.js';

// ---- notices: every error from the API is shown in words ---------------------------------

let noticeBox = null;

export function setNoticeBox(el) {
  noticeBox = el;
}

function describe(error) {
  if (error instanceof ApiError) return error.describe();
  return error?.message || String(error);
}

export function showError(error, context) {
  if (!noticeBox) return;
  const text = context ? `${context}: ${describe(error)}` : describe(error);
  // The same failure on every refresh shows once, not as a growing pile.
  for (const existing of noticeBox.querySelectorAll('.notice.error')) {
    if (existing.dataset.text === text) return;
  }
  const notice = h('div.notice.error', { role: 'alert', dataset: { text } }, h('span', {}, text),
    h('button.small', { type: 'button', onclick: () => notice.remove() }, 'Dismiss'));
  noticeBox.append(notice);
}

const MAX_OK_NOTICES = 3;

export function showOk(text) {
  if (!noticeBox) return;
  const shown = noticeBox.querySelectorAll('.notice.ok');
  if (shown.length >= MAX_OK_NOTICES) shown[0].remove();
  const notice = h('div.notice.ok', { role: 'status' }, h('span', {}, text),
    h('button.small', { type: 'button', onclick: () => notice.remove() }, 'Dismiss'));
  noticeBox.append(notice);
  setTimeout(() => notice.remove(), 6000);
}

// A new page starts without the last page's errors; confirmations of what was just done
// (which may have led to the new page) stay until they fade.
export function clearErrors() {
  for (const notice of noticeBox?.querySelectorAll('.notice.error') || []) notice.remove();
}

// ---- confirmation: every destructive action asks first ------------------------------------

// Resolves to true (or the typed text when `input` is given) if the operator confirms, else null.
export function confirmAction(message, { confirmLabel = 'Delete', input = null } = {}) {
  return new Promise((resolve) => {
    const field = input ? h('input', { type: 'text', name: 'confirm-input', value: input.value || '' }) : null;
    const dialog = h('dialog.confirm', {},
      h('p', {}, message),
      field ? h('label', {}, input.label, field) : null,
      h('div.actions', {},
        h('button', { type: 'button', value: 'cancel', onclick: () => dialog.close('cancel') }, 'Cancel'),
        h('button.danger', { type: 'button', value: 'confirm', onclick: () => dialog.close('confirm') }, confirmLabel)));
    dialog.addEventListener('close', () => {
      dialog.remove();
      if (dialog.returnValue !== 'confirm') resolve(null);
      else resolve(field ? field.value : true);
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

// Run an API change: on success show `done`, on failure show the error; returns success.
export async function act(action, done, failedContext) {
  try {
    await action();
    if (done) showOk(done);
    return true;
  } catch (error) {
    showError(error, failedContext);
    return false;
  }
}

// ---- tables --------------------------------------------------------------------------------

// columns: [{title, cell: row => node|text, num: bool, sort: 'api.field', cls}]
export function table(columns, rows, { empty = 'Nothing to show.', sort = null, onSort = null } = {}) {
  if (!rows.length) return h('p.empty', {}, empty);
  const head = h('tr', {}, columns.map((column) => {
    const classes = [column.num ? 'num' : '', column.sort && onSort ? 'sortable' : '',
      sort && column.sort === sort.key ? 'sorted' : '', sort && column.sort === sort.key && sort.reverse ? 'reverse' : '']
      .filter(Boolean).join(' ');
    return h('th', { class: classes || null, title: column.help || null, onclick: column.sort && onSort ? () => onSort(column.sort) : null },
      column.title);
  }));
  const body = rows.map((row) => h('tr', {}, columns.map((column) => {
    const cls = column.num ? 'num' : column.cls || null;
    return h('td', { class: cls }, column.cell(row));
  })));
  return h('div.table-wrap', {}, h('table', {}, h('thead', {}, head), h('tbody', {}, body)));
}

// Key/value rows: [[label, value], ...]
export function kvTable(rows) {
  return h('table.kv', {}, h('tbody', {}, rows.filter(Boolean).map(([key, value]) => h('tr', {}, h('th', {}, key), h('td', {}, value)))));
}

// A server-side paged, sorted and filtered list, as the API pages vhosts, exchanges, queues,
// connections and channels: only one page (at most 500 items) ever reaches the browser.
export class PagedList {
  constructor({ path, columns, sort = 'name', empty, columnsParam }) {
    this.path = path; // () => '/api/queues' or '/api/queues/%2F'
    this.columns = columns;
    this.sort = { key: sort, reverse: false };
    this.page = 1;
    this.pageSize = 100;
    this.filter = '';
    this.regex = false;
    this.empty = empty;
    this.columnsParam = columnsParam;
    this.tableBox = h('div.list-table');
    this.pagerBox = h('div.pager');
    this.el = h('div.paged', {}, this.tools(), this.tableBox, this.pagerBox);
  }

  tools() {
    const filterInput = h('input', { type: 'search', name: 'filter', placeholder: 'Filter by name', value: this.filter });
    const regexBox = h('input', { type: 'checkbox', name: 'regex' });
    const apply = () => { this.filter = filterInput.value; this.regex = regexBox.checked; this.page = 1; this.refresh(); };
    filterInput.addEventListener('change', apply);
    filterInput.addEventListener('keydown', (event) => { if (event.key === 'Enter') apply(); });
    regexBox.addEventListener('change', apply);
    const sizeSelect = h('select', { name: 'page-size', onchange: () => { this.pageSize = Number(sizeSelect.value); this.page = 1; this.refresh(); } },
      [20, 50, 100, 500].map((n) => h('option', { value: String(n), selected: n === this.pageSize }, `${n} per page`)));
    return h('div.list-tools', {}, filterInput, h('label', {}, regexBox, ' Regex'), sizeSelect);
  }

  query() {
    const params = new URLSearchParams({ page: String(this.page), page_size: String(this.pageSize), sort: this.sort.key,
      sort_reverse: String(this.sort.reverse) });
    if (this.filter) {
      params.set('name', this.filter);
      params.set('use_regex', String(this.regex));
    }
    if (this.columnsParam) params.set('columns', this.columnsParam);
    return `${this.path()}?${params}`;
  }

  async refresh() {
    let result;
    try {
      result = await get(this.query());
    } catch (error) {
      if (error instanceof ApiError && error.error === 'page_out_of_range' && this.page > 1) {
        this.page = 1; // the list shrank under us
        return this.refresh();
      }
      throw error;
    }
    this.render(result);
    return result;
  }

  render(result) {
    const onSort = (key) => {
      this.sort = { key, reverse: this.sort.key === key ? !this.sort.reverse : false };
      this.refresh().catch((error) => showError(error));
    };
    replace(this.tableBox, table(this.columns, result.items, { empty: this.empty, sort: this.sort, onSort }));
    const go = (page) => { this.page = page; this.refresh().catch((error) => showError(error)); };
    const filtered = result.filtered_count !== result.total_count ? ` (${num(result.filtered_count)} match the filter)` : '';
    replace(this.pagerBox,
      h('button.small', { type: 'button', disabled: result.page <= 1, onclick: () => go(result.page - 1) }, '‹ Previous'),
      h('span', {}, `Page ${num(result.page)} of ${num(result.page_count)} · ${num(result.total_count)} in all${filtered}`),
      h('button.small', { type: 'button', disabled: result.page >= result.page_count, onclick: () => go(result.page + 1) }, 'Next ›'));
  }
}

// ---- forms ---------------------------------------------------------------------------------

export function field(label, input, help) {
  return [h('label.field', { for: input.id || null, title: help || null }, label), input];
}

export function textInput(name, attrs = {}) {
  return h('input', { type: 'text', name, id: `f-${name}-${Math.random().toString(36).slice(2, 8)}`, ...attrs });
}

export function select(name, options, value) {
  return h('select', { name }, options.map((option) => {
    const [optionValue, label] = Array.isArray(option) ? option : [option, option];
    return h('option', { value: optionValue, selected: optionValue === value }, label);
  }));
}

export function checkbox(name, label, checked = false) {
  const box = h('input', { type: 'checkbox', name, checked });
  return { box, el: h('label', {}, box, ` ${label}`) };
}

// Parse a JSON object typed by the operator (arguments, headers); an error names the field.
export function parseObject(text, what) {
  if (!text.trim()) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new Error(`${what} must be a JSON object: ${error.message}`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error(`${what} must be a JSON object, like {"x-message-ttl": 60000}`);
  return value;
}

// A form whose submit runs `handler(form)`; its error line shows what went wrong.
export function form(cls, children, handler, submitLabel) {
  const error = h('div.form-error', { role: 'alert' });
  const button = h('button.primary', { type: 'submit' }, submitLabel);
  const el = h(`form.${cls}`, {}, children, h('div.full.actions', {}, button), error);
  el.addEventListener('submit', async (event) => {
    event.preventDefault();
    replace(error);
    button.disabled = true;
    try {
      await handler(el);
    } catch (failure) {
      replace(error, failure instanceof ApiError ? failure.describe() : failure.message);
    } finally {
      button.disabled = false;
    }
  });
  return el;
}

export function section(title, body, open = false) {
  return h('details.section', { open }, h('summary', {}, title), h('div.body', {}, body));
}

// ---- queue features, as RabbitMQ's queue list abbreviates them ----------------------------

const FEATURES = [
  ['x-message-ttl', 'TTL', 'Message TTL'],
  ['x-expires', 'Exp', 'Queue expires'],
  ['x-max-length', 'Lim', 'Maximum length'],
  ['x-max-length-bytes', 'Lim B', 'Maximum length in bytes'],
  ['x-overflow', 'Ovfl', 'Overflow behaviour'],
  ['x-dead-letter-exchange', 'DLX', 'Dead-letter exchange'],
  ['x-dead-letter-routing-key', 'DLK', 'Dead-letter routing key'],
  ['x-max-priority', 'Pri', 'Maximum priority'],
  ['x-single-active-consumer', 'SAC', 'Single active consumer'],
  ['x-delivery-limit', 'DL', 'Delivery limit'],
  ['x-queue-mode', 'Mode', 'Queue mode'],
  ['x-max-age', 'Age', 'Maximum age (stream retention)'],
  ['x-stream-max-segment-size-bytes', 'Seg B', 'Maximum segment size in bytes'],
];

export function badge(text, title, cls = '') {
  return h(`span.badge${cls ? '.' + cls : ''}`, { title }, text);
}

export function queueFeatures(queue) {
  const badges = [];
  if (queue.durable) badges.push(badge('D', 'Durable: survives a broker restart'));
  if (queue.auto_delete) badges.push(badge('AD', 'Auto-delete: deleted when its last consumer goes'));
  if (queue.exclusive) badges.push(badge('Excl', 'Exclusive to the connection that declared it'));
  const args = queue.arguments || {};
  for (const [key, short, label] of FEATURES) {
    if (key in args) badges.push(badge(short, `${label}: ${JSON.stringify(args[key])}`));
  }
  const policy = queue.policy || queue.operator_policy;
  if (policy) badges.push(badge(policy, 'Policy', 'policy'));
  return badges;
}

export function exchangeFeatures(exchange) {
  const badges = [];
  if (exchange.durable) badges.push(badge('D', 'Durable'));
  if (exchange.auto_delete) badges.push(badge('AD', 'Auto-delete'));
  if (exchange.internal) badges.push(badge('I', 'Internal: clients cannot publish to it'));
  for (const [key, value] of Object.entries(exchange.arguments || {})) {
    badges.push(badge(key === 'alternate-exchange' ? 'AE' : key, `${key}: ${JSON.stringify(value)}`));
  }
  return badges;
}

// ---- charts (uPlot, vendored in ui/vendor/uplot) ------------------------------------------

const COUNT_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7, 1e8, 1e9];
const PALETTE = ['#e8641b', '#1f5fa8', '#1b7f3b', '#8e44ad', '#b3261e', '#6b7280', '#0e8a8a'];

function showNewest(plot) {
  const points = plot.data[0].length;
  if (points && plot.cursor.idx == null) plot.setLegend({ idx: points - 1 });
}

// Charts register here by name so the browser tests read the very data a chart draws.
window.amqpUi = window.amqpUi || { charts: {} };

export class LineChart {
  // counts: the values are whole numbers (no 0.5 ticks on a message count axis).
  constructor(name, seriesLabels, { valueFormat = (v) => v, height = 220, counts = false } = {}) {
    this.name = name;
    this.counts = counts;
    this.el = h('div.chart', { id: `chart-${name}` });
    this.labels = seriesLabels;
    this.valueFormat = valueFormat;
    this.height = height;
    this.plot = null;
    this.resize = new ResizeObserver(() => this.fit());
    this.resize.observe(this.el);
  }

  options(width) {
    return {
      width, height: this.height,
      cursor: { drag: { x: false, y: false } },
      scales: {
        x: { time: true },
        y: { range: (u, min, max) => [0, Math.max(max * 1.1, this.counts ? 5 : 1)] },
      },
      axes: [{}, { size: 64, values: (u, ticks) => ticks.map((v) => this.valueFormat(v)),
        incrs: this.counts ? COUNT_STEPS : undefined }],
      // Away from the cursor the legend shows the newest values rather than dashes.
      hooks: { setCursor: [(u) => { if (u.cursor.idx == null) showNewest(u); }] },
      series: [{}, ...this.labels.map((label, i) => ({ label, stroke: PALETTE[i % PALETTE.length], width: 2,
        value: (u, v) => (v === null || v === undefined ? '–' : this.valueFormat(v)) }))],
    };
  }

  // Shown instead of an empty chart until there are points to draw.
  waiting(text) {
    if (!this.plot) replace(this.el, h('p.muted', {}, text));
  }

  // times: seconds since the epoch, ascending; columns: one array per series.
  update(times, columns) {
    const data = [times, ...columns];
    if (!this.plot) {
      if (typeof window.uPlot !== 'function') return; // the deferred library is still loading
      this.el.replaceChildren();
      this.plot = new window.uPlot(this.options(Math.max(this.el.clientWidth, 300)), data, this.el);
      window.amqpUi.charts[this.name] = this.plot;
    } else {
      this.plot.setData(data);
    }
    // At least a minute wide: a single point or a few seconds of them get a readable axis, not
    // one of years (uPlot's choice for one point) or of milliseconds.
    const newest = times[times.length - 1];
    if (times.length && newest - times[0] < 60) this.plot.setScale('x', { min: newest - 60, max: newest });
    showNewest(this.plot);
  }

  fit() {
    if (this.plot && this.el.clientWidth) this.plot.setSize({ width: this.el.clientWidth, height: this.height });
  }

  destroy() {
    this.resize.disconnect();
    this.plot?.destroy();
    if (window.amqpUi.charts[this.name] === this.plot) delete window.amqpUi.charts[this.name];
  }
}

// A chart fed by polling: keeps what it has seen while the page is open (queue detail pages;
// the API keeps history only for the overview).
export class PolledChart extends LineChart {
  constructor(name, seriesLabels, options) {
    super(name, seriesLabels, options);
    this.times = [];
    this.columns = seriesLabels.map(() => []);
    this.keepSeconds = 600;
  }

  push(values) {
    const now = Date.now() / 1000;
    this.times.push(now);
    values.forEach((value, i) => this.columns[i].push(value ?? null));
    while (this.times.length && this.times[0] < now - this.keepSeconds) {
      this.times.shift();
      this.columns.forEach((column) => column.shift());
    }
    this.update(this.times, this.columns);
  }
}

export { add };
