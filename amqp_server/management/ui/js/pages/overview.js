// Overview: node, version, uptime, listeners, totals, queued messages and message rates over
// the last minute, 10 minutes or hour (the API's sample history), memory and disk against
// their alarm thresholds, and the alarms in force.

import { h, replace, num, rate, bytes, duration } from '../dom.js';
import { get } from '../api.js';
import { LineChart, table, kvTable } from '../widgets.js';

// [label, age in seconds, seconds between samples]
const RANGES = [['Last minute', 60, 5], ['Last 10 minutes', 600, 5], ['Last hour', 3600, 30]];
const LENGTHS = [['messages_ready', 'Ready'], ['messages_unacknowledged', 'Unacked'], ['messages', 'Total']];
const RATES = [['publish', 'Publish'], ['deliver_get', 'Deliver / get'], ['ack', 'Ack'], ['redeliver', 'Redeliver'],
  ['confirm', 'Confirm']];

// [{sample, timestamp}] newest first -> ascending [seconds], [values]
function series(samples) {
  const ascending = [...(samples || [])].reverse();
  return [ascending.map((s) => s.timestamp / 1000), ascending.map((s) => s.sample)];
}

// Counter samples -> per-second rates between consecutive samples.
function rates(samples) {
  const [times, values] = series(samples);
  const shownTimes = [];
  const shown = [];
  for (let i = 1; i < times.length; i += 1) {
    const seconds = times[i] - times[i - 1];
    if (seconds <= 0) continue;
    shownTimes.push(times[i]);
    shown.push(Math.max(0, (values[i] - values[i - 1]) / seconds));
  }
  return [shownTimes, shown];
}

function card(label, value, href, small = false) {
  const shown = href ? h(`a.value${small ? '.small' : ''}`, { href }, value) : h(`div.value${small ? '.small' : ''}`, {}, value);
  return h('div.card', { dataset: { card: label.toLowerCase() } }, h('div.label', {}, label), shown);
}

function meter(used, limit, alarm) {
  const fill = limit ? Math.min(used / limit, 1) * 100 : 0;
  return h(`div.meter${alarm ? '.alarm' : ''}`, { title: `${bytes(used)} of ${bytes(limit)}` },
    h('div.fill', { style: null, dataset: { fill: fill.toFixed(0) } }));
}

export function render(app) {
  let rangeIndex = Number(localStorage.getItem('amqp-ui-range') ?? 0) % RANGES.length;
  let first = true;
  const alarms = h('div.alarms');
  const cards = h('div.cards');
  const totals = h('div.cards');
  const lengthsChart = new LineChart('queued-messages', LENGTHS.map(([, label]) => label), { valueFormat: (v) => num(Math.round(v)), counts: true });
  const ratesChart = new LineChart('message-rates', RATES.map(([, label]) => label), { valueFormat: (v) => rate(v) });
  const lengthsNow = h('div.now');
  const ratesNow = h('div.now');
  const resources = h('div');
  const listeners = h('div');
  const rangeButtons = RANGES.map(([label], index) => h('button.small', { type: 'button', dataset: { range: String(index) },
    class: index === rangeIndex ? 'small active' : 'small',
    onclick: () => {
      rangeIndex = index;
      localStorage.setItem('amqp-ui-range', String(index));
      rangeButtons.forEach((button, i) => button.classList.toggle('active', i === index));
      refresh().catch(() => {});
    } }, label));

  const el = h('div.overview', {},
    h('div.page-head', {}, h('h1', {}, 'Overview')),
    alarms, cards, totals,
    h('div.panel', {}, h('div.chart-head', {}, h('h2', {}, 'Queued messages'), h('div.ranges', {}, rangeButtons)), lengthsChart.el, lengthsNow),
    h('div.panel', {}, h('div.chart-head', {}, h('h2', {}, 'Message rates')), ratesChart.el, ratesNow),
    h('div.grid', {},
      h('div.panel', {}, h('h2', {}, 'Memory and disk'), resources),
      h('div.panel', {}, h('h2', {}, 'Listeners'), listeners)));

  async function refresh() {
    const [, age, incr] = RANGES[rangeIndex];
    const query = new URLSearchParams({ lengths_age: age, lengths_incr: incr, msg_rates_age: age, msg_rates_incr: incr });
    const [overview, nodes] = await Promise.all([
      get(`/api/overview?${query}`),
      app.isMonitor() ? get('/api/nodes') : Promise.resolve(null),
    ]);
    const node = nodes?.find((n) => n.name === overview.node) || null;
    showAlarms(node);
    showCards(overview, node);
    showCharts(overview);
    showResources(node);
    showListeners(overview.listeners);
    if (first) {
      first = false;
      performance.mark('overview-ready');
      el.dataset.ready = 'true';
    }
  }

  function showAlarms(node) {
    const inForce = [];
    if (node?.mem_alarm) inForce.push(`Memory alarm: ${bytes(node.mem_used)} used, high watermark ${bytes(node.mem_limit)}.`);
    if (node?.disk_free_alarm) inForce.push(`Disk alarm: ${bytes(node.disk_free)} free, limit ${bytes(node.disk_free_limit)}.`);
    replace(alarms, inForce.length
      ? h('div.alarm-box', { role: 'alert' }, inForce.join(' '), ' Publishing connections are blocked until it clears.')
      : null);
  }

  function showCards(overview, node) {
    const counts = overview.object_totals || {};
    replace(cards,
      card('Node', overview.node, null, true),
      card('Version', `${overview.product_name} ${overview.product_version}`, null, true),
      card('Uptime', node ? duration(node.uptime) : '–', null, true),
      card('Cluster', overview.cluster_name, null, true));
    replace(totals,
      card('Connections', num(counts.connections), '#/connections'),
      card('Channels', num(counts.channels), '#/channels'),
      card('Exchanges', num(counts.exchanges), '#/exchanges'),
      card('Queues', num(counts.queues), '#/queues'),
      card('Consumers', num(counts.consumers), '#/queues'));
  }

  function showCharts(overview) {
    const queueTotals = overview.queue_totals || {};
    const lengthSeries = LENGTHS.map(([field]) => series(queueTotals[`${field}_details`]?.samples));
    if (lengthSeries[0][0].length) lengthsChart.update(lengthSeries[0][0], lengthSeries.map(([, values]) => values));
    else lengthsChart.waiting(queueTotals.messages_details ? 'Collecting samples (one every 5 s)…'
      : 'Queued messages over time are charted for users tagged monitoring or administrator.');
    replace(lengthsNow, table(LENGTHS.map(([field, label]) => ({ title: `${label} now`, num: true, cell: () => num(queueTotals[field]) })), [{}]));
    const stats = overview.message_stats || {};
    if (!Object.keys(stats).length) {
      ratesChart.waiting('');
      replace(ratesNow, h('p.muted', {}, 'Broker-wide message rates are shown to users tagged monitoring or administrator.'));
      return;
    }
    const rateSeries = RATES.map(([field]) => rates(stats[`${field}_details`]?.samples));
    if (rateSeries[0][0].length) ratesChart.update(rateSeries[0][0], rateSeries.map(([, values]) => values));
    else ratesChart.waiting('Collecting samples (one every 5 s): rates need two…');
    replace(ratesNow, table(RATES.map(([field, label]) => ({ title: `${label} now`, num: true, cell: () => rate(stats[`${field}_details`]?.rate) })), [{}]));
  }

  function showResources(node) {
    if (!node) {
      replace(resources, h('p.muted', {}, 'Memory and disk figures are shown to users tagged monitoring or administrator.'));
      return;
    }
    const memory = meter(node.mem_used, node.mem_limit, node.mem_alarm);
    const disk = meter(node.disk_free_limit, node.disk_free, node.disk_free_alarm);
    replace(resources,
      h('h3', {}, 'Memory ', node.mem_alarm ? h('span.state-blocked', {}, '(alarm)') : null), memory,
      kvTable([['Used', bytes(node.mem_used)], ['High watermark (alarm above)', bytes(node.mem_limit)]]),
      h('h3', {}, 'Disk ', node.disk_free_alarm ? h('span.state-blocked', {}, '(alarm)') : null), disk,
      kvTable([['Free', bytes(node.disk_free)], ['Free disk limit (alarm below)', bytes(node.disk_free_limit)]]),
      h('h3', {}, 'Resources'),
      kvTable([['File descriptors', `${num(node.fd_used)} of ${num(node.fd_total)}`],
        ['Sockets', `${num(node.sockets_used)} of ${num(node.sockets_total)}`]]));
    // Widths are set through the CSSOM: the page's CSP allows no inline style attributes.
    for (const fill of resources.querySelectorAll('.meter > .fill')) fill.style.width = `${fill.dataset.fill}%`;
  }

  function showListeners(list) {
    replace(listeners, table([
      { title: 'Protocol', cell: (l) => l.protocol },
      { title: 'Bound to', cell: (l) => l.ip_address },
      { title: 'Port', num: true, cell: (l) => String(l.port) },
      { title: 'TLS', cell: (l) => (/ssl|https/.test(l.protocol) ? 'yes' : 'no') },
    ], list || [], { empty: 'No listeners reported.' }));
  }

  return {
    el,
    refresh,
    destroy() {
      lengthsChart.destroy();
      ratesChart.destroy();
    },
  };
}
