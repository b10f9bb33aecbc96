// The one door to the broker: every page reads and changes it through the management API
// (/api/...), with the session cookie the login set. Writes carry the session's CSRF token;
// every request says it comes from the UI, so a 401 does not open the browser's own password
// dialog. Errors become ApiError with the API's reason in words.

let csrfToken = null;
let onSessionLost = () => {};

export class ApiError extends Error {
  constructor(status, error, reason) {
    super(reason || error || `HTTP ${status}`);
    this.status = status;
    this.error = error;
    this.reason = reason;
  }

  // What the operator reads: "Access refused. (401 not_authorised)".
  describe() {
    if (this.status === 0) return this.message;
    const code = [this.status, this.error].filter(Boolean).join(' ');
    return `${this.message} (${code})`;
  }
}

// `lostHandler` runs when a request finds the session gone (401 "Login failed").
export function setSession(token, lostHandler = () => {}) {
  csrfToken = token;
  onSessionLost = lostHandler;
}

export async function request(method, path, { body, headers = {}, text = false } = {}) {
  const init = { method, credentials: 'same-origin', headers: { 'X-Requested-With': 'XMLHttpRequest', ...headers } };
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) init.headers['X-CSRF-Token'] = csrfToken;
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = typeof body === 'string' ? body : JSON.stringify(body);
  }
  let response;
  try {
    // Relative to the page ("api/..."), so a proxy that serves the UI under a prefix works too.
    response = await fetch(path.replace(/^\//, ''), init);
  } catch (error) {
    throw new ApiError(0, 'network', `The broker did not answer: ${error.message}`);
  }
  const payload = response.status === 204 ? '' : await response.text();
  if (!response.ok) {
    let parsed = null;
    try { parsed = JSON.parse(payload); } catch { /* not JSON: shown as text below */ }
    const failure = response.status === 415
      ? new ApiError(415, 'unsupported_media_type', 'The broker accepts only JSON bodies')
      : new ApiError(response.status, parsed?.error, parsed?.reason || payload || response.statusText);
    if (response.status === 401 && failure.reason === 'Login failed') onSessionLost(failure);
    throw failure;
  }
  if (text) return payload;
  return payload ? JSON.parse(payload) : null;
}

export const get = (path) => request('GET', path);
export const put = (path, body) => request('PUT', path, { body });
export const post = (path, body) => request('POST', path, { body });
export const del = (path, headers) => request('DELETE', path, { headers });

// A path with each interpolated value URL-encoded: api`/api/queues/${vhost}/${name}`.
export function api(strings, ...values) {
  return strings.reduce((path, part, i) => path + part + (i < values.length ? encodeURIComponent(values[i]) : ''), '');
}
