// DOM building and number formatting. Elements are made with h() and text is always added as
// text nodes, never parsed as HTML: queue names, headers and payloads come from clients and
// must not be able to inject markup into an operator's browser.

export function h(tag, attrs, ...children) {
  const [name, ...classes] = tag.split('.');
  const el = document.createElement(name || 'div');
  if (classes.length) el.className = classes.join(' ');
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value' || key === 'checked' || key === 'selected') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  add(el, children);
  return el;
}

export function add(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return add(el, children);
}

const integers = new Intl.NumberFormat('en');

export function num(value) {
  if (value === undefined || value === null) return '–';
  return integers.format(value);
}

export function rate(value) {
  if (value === undefined || value === null) return '–';
  return `${value.toFixed(value >= 100 ? 0 : 1)}/s`;
}

export function rateOf(stats, field) {
  return stats?.[`${field}_details`]?.rate;
}

export function bytes(value) {
  if (value === undefined || value === null) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let shown = value;
  let unit = 0;
  while (Math.abs(shown) >= 1024 && unit < units.length - 1) { shown /= 1024; unit += 1; }
  return `${unit ? shown.toFixed(1) : shown} ${units[unit]}`;
}

export function duration(ms) {
  if (ms === undefined || ms === null) return '–';
  let seconds = Math.floor(ms / 1000);
  const days = Math.floor(seconds / 86400); seconds -= days * 86400;
  const hours = Math.floor(seconds / 3600); seconds -= hours * 3600;
  const minutes = Math.floor(seconds / 60); seconds -= minutes * 60;
  if (days) return `${days}d ${hours}h`;
  if (hours) return `${hours}h ${minutes}m`;
  if (minutes) return `${minutes}m ${seconds}s`;
  return `${seconds}s`;
}

export function when(ms) {
  return ms ? new Date(ms).toLocaleString() : '–';
}

export function yesNo(value) {
  return value ? 'yes' : 'no';
}

// A JSON value as compact text (arguments, headers, client properties).
export function jsonText(value) {
  if (value === undefined || value === null) return '';
  if (typeof value === 'string') return value;
  return JSON.stringify(value);
}

// A URL fragment: '#/queues/' + seg(vhost) + '/' + seg(name).
export function seg(value) {
  return encodeURIComponent(value);
}
