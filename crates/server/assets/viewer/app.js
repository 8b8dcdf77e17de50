// The skillstate web viewer. Talks to the /v1 API only, with the API key kept in
// sessionStorage. Every value from the server is shown with textContent (model output is
// untrusted); nothing is ever inserted as markup.
'use strict';

const KEY_STORE = 'skillstate.key';
const STEP_PAGE = 100;
const CHART_PAGE = 1000;
const CHART_AUTO_STEPS = 2000;
const STATUSES = ['running', 'completed', 'failed', 'awaiting_input', 'awaiting_approval'];
const WRITE_PAGE = 50;
const HIT_PAGE = 20;
const HIT_KINDS = ['observation', 'reasoning', 'action', 'state'];

// `skillstate view` prints its link with a key of its own in the fragment (#key=…; a fragment
// never reaches the server): the key is kept for this tab and taken out of the address bar and
// the history before anything else runs.
(function keyFromFragment() {
  const match = location.hash.match(/^#key=([^&?/]*)$/);
  if (!match) return;
  let key = '';
  try { key = decodeURIComponent(match[1]).trim(); } catch (e) { key = ''; }
  if (key) sessionStorage.setItem(KEY_STORE, key);
  history.replaceState(null, '', location.pathname + location.search + '#/');
})();

// ---------------------------------------------------------------- DOM helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// replaceChildren() without the absent ones (it would write "null").
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

const SVG_NS = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setAttrs(node, attrs) {
  if (!attrs) return;
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'onclick' || name === 'onchange' || name === 'oninput' || name === 'onsubmit') {
      node.addEventListener(name.slice(2), value);
    } else if (name === 'dataset') {
      Object.assign(node.dataset, value);
    } else {
      node.setAttribute(name, value === true ? '' : String(value));
    }
  }
}

function toast(message, isError) {
  const box = document.getElementById('toast');
  const line = el('div', { class: isError ? 'error' : null }, message);
  box.append(line);
  setTimeout(() => line.remove(), isError ? 9000 : 4000);
}

function badge(status) {
  return el('span', { class: 'badge ' + (status || 'unknown') }, status || 'unreadable');
}

function compactJson(value, max) {
  let text = JSON.stringify(value);
  if (text === undefined) text = String(value);
  if (max && text.length > max) text = text.slice(0, max - 1) + '…';
  return text;
}

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (signal) signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// ---------------------------------------------------------------- the API

class NeedKey extends Error {}

function apiKey() {
  return sessionStorage.getItem(KEY_STORE);
}

function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: 'Bearer ' + key } : {};
}

async function api(path, options) {
  if (!apiKey()) throw new NeedKey('no key');
  const init = Object.assign({ cache: 'no-store' }, options || {});
  init.headers = Object.assign(authHeaders(), init.headers || {});
  if (init.json !== undefined) {
    init.method = init.method || 'POST';
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(init.json);
    delete init.json;
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    sessionStorage.removeItem(KEY_STORE);
    throw new NeedKey('the key was refused');
  }
  const text = await response.text();
  let body = null;
  if (text) {
    try { body = JSON.parse(text); } catch (e) { body = text; }
  }
  if (!response.ok) {
    const detail = body && typeof body === 'object' && body.detail ? body.detail : text;
    const error = new Error(response.status + ': ' + detail);
    error.status = response.status;
    error.problem = body;
    throw error;
  }
  return body;
}

const enc = encodeURIComponent;

// Follows a Server-Sent Events stream with fetch() (EventSource cannot send the key), resuming
// with Last-Event-ID after a drop. A stream with no id yet starts from now (?after=latest: no
// past event is read; the page has just read the current figures). The last id is kept for the
// browser session, so a page opened again resumes where it was.
async function followEvents(path, onEvent, signal) {
  const memory = 'skillstate.events:' + path;
  let last = sessionStorage.getItem(memory);
  let delay = 1000;
  while (!signal.aborted) {
    try {
      const headers = authHeaders();
      headers.Accept = 'text/event-stream';
      if (last) headers['Last-Event-ID'] = last;
      const url = last ? path : path + (path.includes('?') ? '&' : '?') + 'after=latest';
      const response = await fetch(url, { headers, signal, cache: 'no-store' });
      if (response.status === 401) { sessionStorage.removeItem(KEY_STORE); route(); return; }
      if (response.status === 400 && last) { last = null; sessionStorage.removeItem(memory); continue; }
      if (response.status === 404) return;
      if (!response.ok || !response.body) throw new Error('events: ' + response.status);
      setLive('live');
      // Started from now: what changed between the page's read and the stream's start is
      // read again once (the handlers re-read on any event).
      if (!last) { try { onEvent('open', null); } catch (e) { console.error(e); } }
      delay = 1000;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      let event = { id: null, name: 'message', data: [] };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf('\n')) >= 0) {
          let line = buffer.slice(0, end);
          buffer = buffer.slice(end + 1);
          if (line.endsWith('\r')) line = line.slice(0, -1);
          if (line === '') {
            if (event.data.length) {
              if (event.id) { last = event.id; sessionStorage.setItem(memory, last); }
              let data = null;
              try { data = JSON.parse(event.data.join('\n')); } catch (e) { data = null; }
              try { onEvent(event.name, data); } catch (e) { console.error(e); }
            }
            event = { id: null, name: 'message', data: [] };
            continue;
          }
          if (line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let text = colon < 0 ? '' : line.slice(colon + 1);
          if (text.startsWith(' ')) text = text.slice(1);
          if (field === 'id') event.id = text;
          else if (field === 'event') event.name = text;
          else if (field === 'data') event.data.push(text);
        }
      }
    } catch (error) {
      if (signal.aborted) return;
    }
    setLive('reconnecting…');
    await sleep(delay, signal);
    delay = Math.min(delay * 2, 15000);
  }
}

function setLive(text) {
  document.getElementById('live').textContent = text || '';
}

// ---------------------------------------------------------------- routing

let pageAbort = new AbortController();

function parseHash() {
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  return { path, params: new URLSearchParams(query || '') };
}

function go(path, params) {
  const query = params && params.toString();
  location.hash = '#' + path + (query ? '?' + query : '');
}

async function route() {
  pageAbort.abort();
  pageAbort = new AbortController();
  setLive('');
  const main = document.getElementById('main');
  main.replaceChildren();
  document.getElementById('toast').replaceChildren();
  document.getElementById('forget-key').hidden = !apiKey();
  const { path, params } = parseHash();
  try {
    if (path === '/bench') {
      await benchPage(main, pageAbort.signal);
      return;
    }
    if (!apiKey()) throw new NeedKey('');
    const task = path.match(/^\/tasks\/([^/]+)$/);
    const batch = path.match(/^\/batches\/([^/]+)$/);
    const board = path.match(/^\/boards\/([^/]+)$/);
    if (task) await taskPage(main, decodeURIComponent(task[1]), params, pageAbort.signal);
    else if (batch) await batchPage(main, decodeURIComponent(batch[1]), pageAbort.signal);
    else if (board) await boardPage(main, decodeURIComponent(board[1]), pageAbort.signal);
    else if (path === '/batches') await batchList(main, params, pageAbort.signal);
    else if (path === '/boards') await boardList(main, pageAbort.signal);
    else await listPage(main, params, pageAbort.signal);
  } catch (error) {
    if (error instanceof NeedKey) keyForm(main, error.message);
    else if (!pageAbort.signal.aborted) main.append(el('p', { class: 'error', role: 'alert' }, String(error.message || error)));
  }
}

function keyForm(main, why) {
  main.replaceChildren();
  const input = el('input', { type: 'password', id: 'key-input', autocomplete: 'off', 'aria-describedby': 'key-help' });
  const form = el('form', {
    class: 'key-form',
    onsubmit: (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_STORE, key);
      route();
    },
  },
  el('h1', null, 'API key'),
  why ? el('p', { role: 'alert' }, why) : null,
  el('p', { id: 'key-help', class: 'muted' }, 'The viewer reads tasks through the /v1 API with a key of your tenant (skillstate keys create --tenant <name>). It is kept in this browser tab only (sessionStorage) and sent as Authorization: Bearer. For a local database, skillstate view prints a link that carries a key of its own: open that link instead.'),
  el('label', { class: 'field', for: 'key-input' }, 'Key'), input,
  el('p', null, el('button', { type: 'submit', class: 'primary', id: 'key-save' }, 'Use this key')));
  main.append(form);
  input.focus();
}

// ---------------------------------------------------------------- task list

async function listPage(main, params, signal) {
  const status = params.get('status') || '';
  const skill = params.get('skill') || '';
  const label = params.get('label') || '';
  const batch = params.get('batch') || '';
  const cursor = params.get('cursor') || '';
  const statusSelect = el('select', { id: 'filter-status' },
    el('option', { value: '' }, 'any'),
    STATUSES.map((s) => el('option', { value: s, selected: s === status }, s)));
  const skillInput = el('input', { type: 'text', id: 'filter-skill', value: skill, placeholder: 'warehouse' });
  const labelInput = el('input', { type: 'text', id: 'filter-label', value: label, placeholder: 'name:value' });
  const searchInput = el('input', { type: 'text', id: 'search-id', placeholder: 'task id or its start', autocomplete: 'off', spellcheck: 'false' });
  const found = el('p', { id: 'search-found', class: 'muted', 'aria-live': 'polite' });
  const matchList = el('ul', { id: 'search-matches', class: 'matches' });
  let lookTicket = 0; // only the latest lookup shows its answer
  main.append(el('h1', null, 'Tasks'));
  if (batch) main.append(el('p', { id: 'batch-filter' }, 'Tasks of batch ', el('a', { href: '#/batches/' + enc(batch), class: 'mono' }, batch), ' · ', el('a', { href: '#/' }, 'all tasks')));
  main.append(el('form', {
    class: 'filters',
    onsubmit: (event) => {
      event.preventDefault();
      const next = new URLSearchParams();
      if (statusSelect.value) next.set('status', statusSelect.value);
      if (skillInput.value.trim()) next.set('skill', skillInput.value.trim());
      if (labelInput.value.trim()) next.set('label', labelInput.value.trim());
      if (batch) next.set('batch', batch);
      go('/', next);
    },
  },
  el('label', { class: 'field' }, 'Status', statusSelect),
  el('label', { class: 'field' }, 'Skill', skillInput),
  el('label', { class: 'field' }, 'Label', labelInput),
  el('button', { type: 'submit', id: 'filter-apply' }, 'Filter')));
  main.append(el('form', {
    class: 'filters',
    onsubmit: async (event) => {
      event.preventDefault();
      const typed = searchInput.value.trim().toLowerCase();
      const ticket = ++lookTicket;
      matchList.replaceChildren();
      found.removeAttribute('role');
      if (!typed) { found.textContent = ''; return; }
      if (!isIdPrefix(typed)) {
        found.textContent = '\u201c' + typed + '\u201d is not a task id or the start of one: an id is hexadecimal digits and hyphens, as in 0193b2c4-5e6f-7a80-9b1c-2d3e4f5a6b7c.';
        found.setAttribute('role', 'alert');
        return;
      }
      found.textContent = 'looking…';
      try {
        const { matches, more } = await tasksByPrefix(typed);
        if (ticket !== lookTicket || signal.aborted) return;
        if (matches.length === 1 && !more) { go('/tasks/' + enc(matches[0].id)); return; }
        if (!matches.length) {
          found.textContent = 'No task begins with ' + typed + '.';
          found.setAttribute('role', 'alert');
          return;
        }
        found.textContent = more
          ? 'More than ' + matches.length + ' tasks begin with ' + typed + '; type more characters. The newest ' + matches.length + ':'
          : matches.length + ' tasks begin with ' + typed + '; type more characters, or open one:';
        matchList.replaceChildren(...matches.map((task) => el('li', { dataset: { task: task.id } },
          el('a', { href: '#/tasks/' + enc(task.id), class: 'mono task-link' }, task.id), ' ',
          badge(task.status), ' ', task.skill, ' ', el('span', { class: 'muted' }, task.updated_at))));
      } catch (error) {
        if (error instanceof NeedKey) { route(); return; }
        if (ticket !== lookTicket) return;
        found.textContent = error.message;
        found.setAttribute('role', 'alert');
      }
    },
  }, el('label', { class: 'field' }, 'Open a task by its id or the start of it', searchInput), el('button', { type: 'submit', id: 'search-open' }, 'Open')));
  main.append(found, matchList);

  const tbody = el('tbody');
  const table = el('table', { id: 'task-table' },
    el('thead', null, el('tr', null,
      el('th', null, 'Task'), el('th', null, 'Status'), el('th', null, 'Skill'), el('th', null, 'Model'),
      el('th', { class: 'num' }, 'Steps'), el('th', { class: 'num' }, 'Tokens'), el('th', { class: 'num' }, 'Cost'),
      el('th', null, 'Labels'), el('th', null, 'Updated'))),
    tbody);
  const pager = el('div', { class: 'pager' });
  main.append(table, pager);

  const load = async () => {
    const query = new URLSearchParams({ limit: '50' });
    if (status) query.set('status', status);
    if (skill) query.set('skill', skill);
    if (label) query.set('label', label);
    if (batch) query.set('batch', batch);
    if (cursor) query.set('cursor', cursor);
    const page = await api('/v1/tasks?' + query);
    if (signal.aborted) return;
    tbody.replaceChildren(...page.tasks.map((task) => el('tr', { dataset: { task: task.id } },
      el('td', { class: 'mono' }, el('a', { href: '#/tasks/' + enc(task.id), class: 'task-link' }, task.id)),
      el('td', null, badge(task.status), task.problem ? el('span', { class: 'muted' }, ' ' + task.problem) : null),
      el('td', null, task.skill), el('td', null, task.model),
      el('td', { class: 'num' }, String(task.version)),
      el('td', { class: 'num tokens', title: tokensTitle(task.totals) }, thousands(task.totals.prompt_tokens + task.totals.output_tokens)),
      el('td', { class: 'num cost' }, money(task.totals.cost_usd)),
      el('td', { class: 'mono' }, Object.entries(task.labels || {}).map(([k, v]) => k + ':' + v).join(' ')),
      el('td', null, task.updated_at))));
    if (!page.tasks.length) tbody.append(el('tr', null, el('td', { colspan: 9, class: 'muted' }, 'No tasks.')));
    fill(pager,
      cursor ? el('button', { type: 'button', onclick: () => history.back() }, '← Previous page') : null,
      page.next_cursor ? el('button', {
        type: 'button', id: 'next-page', onclick: () => {
          const next = new URLSearchParams(params); next.set('cursor', page.next_cursor); go('/', next);
        },
      }, 'Next page →') : null);
  };
  await load();
  const refresh = debounce(() => load().catch((e) => { if (e instanceof NeedKey) route(); }), 400);
  followEvents('/v1/events', () => refresh(), signal);
}

// A task by the start of its id, as every CLI command takes one. The listing (GET /v1/tasks)
// holds the caller's tenant's tasks alone, highest id first, and its cursor is the id it goes
// on below: a page started just above the highest id that can begin with the prefix opens with
// every task that does, so one page tells none, one or several apart.
const PREFIX_PAGE = 20;
const ID_HYPHENS = [8, 13, 18, 23];

// Whether `text` (lower case) can begin a task id: hex digits, hyphens where an id has them.
function isIdPrefix(text) {
  if (!text || text.length > 36) return false;
  return [...text].every((c, i) => (ID_HYPHENS.includes(i) ? c === '-' : /^[0-9a-f]$/.test(c)));
}

// The lowest id above every id that begins with `prefix`; null when none is (ffff…).
function cursorAbove(prefix) {
  const top = BigInt('0x' + prefix.replace(/-/g, '').padEnd(32, 'f')) + 1n;
  if (top >> 128n) return null;
  const hex = top.toString(16).padStart(32, '0');
  return [hex.slice(0, 8), hex.slice(8, 12), hex.slice(12, 16), hex.slice(16, 20), hex.slice(20)].join('-');
}

// The caller's tasks whose id begins with `prefix`: at most PREFIX_PAGE, newest first, and
// whether there are more.
async function tasksByPrefix(prefix) {
  const query = new URLSearchParams({ limit: String(PREFIX_PAGE + 1) });
  const cursor = cursorAbove(prefix);
  if (cursor) query.set('cursor', cursor);
  const page = await api('/v1/tasks?' + query);
  const matches = [];
  for (const task of page.tasks) {
    if (!task.id.startsWith(prefix)) break;
    matches.push(task);
  }
  return { matches: matches.slice(0, PREFIX_PAGE), more: matches.length > PREFIX_PAGE };
}

// ---------------------------------------------------------------- task page

async function taskPage(main, id, params, signal) {
  let task = await api('/v1/tasks/' + enc(id));
  id = task.id;
  const base = '/v1/tasks/' + enc(id);
  const head = el('div');
  const pause = el('div');
  const messages = el('ul', { id: 'messages' });
  main.append(el('p', null, el('a', { href: '#/' }, '← Tasks')), head, pause);

  // Where a value of the state came from (GET …/state/provenance): every value of the state
  // tree links here.
  const provBox = el('div', { id: 'provenance', class: 'panel provenance', hidden: true });
  let provTicket = 0;
  const closeProvenance = () => { provTicket++; provBox.hidden = true; provBox.replaceChildren(); };
  const provHead = (pointer) => el('div', { class: 'row' },
    el('h3', null, 'Where ', el('code', { id: 'provenance-pointer' }, pointer || '(the whole state)'), ' came from'),
    el('button', { type: 'button', id: 'provenance-close', onclick: closeProvenance }, 'Close'));
  const writeItem = (write) => el('li', { class: 'write', dataset: { step: String(write.step) } },
    stepLink(write.step), ' by ', el('span', { class: 'author' }, authorText(write.author)), ' ',
    el('span', { class: 'muted', title: write.created_at }, String(write.created_at).replace('T', ' ').replace('Z', ' UTC')),
    el('div', null, el('span', { class: 'muted' }, 'value '), el('code', { class: 'value' }, write.value === null || write.value === undefined ? '(removed)' : compactJson(write.value, 300))),
    write.observation === null || write.observation === undefined ? null
      : el('details', null, el('summary', null, 'The observation it answered'), el('pre', { class: 'observation' }, write.observation)),
    el('details', null, el('summary', null, 'The patch'), el('pre', { class: 'patch' }, JSON.stringify(write.patch, null, 2))));
  const showProvenance = async (pointer, all) => {
    const ticket = ++provTicket;
    provBox.hidden = false;
    provBox.replaceChildren(provHead(pointer), el('span', { class: 'muted' }, 'loading…'));
    try {
      const query = new URLSearchParams({ pointer });
      if (all) query.set('all', 'true');
      const found = await api(base + '/state/provenance?' + query);
      if (ticket !== provTicket || signal.aborted) return;
      fill(provBox, provHead(found.pointer),
        el('p', null, el('span', { class: 'muted' }, 'now '), el('code', { id: 'provenance-current' }, found.current === null || found.current === undefined ? '(nothing there)' : compactJson(found.current, 300))),
        found.writes.length
          ? el('ol', { id: 'provenance-writes', class: 'writes' }, found.writes.map(writeItem))
          : el('p', { class: 'muted', id: 'provenance-none' }, 'No kept step wrote it: it is from the initial state, or from before the journal was compacted.'),
        all ? null : el('button', { type: 'button', id: 'provenance-all', onclick: () => showProvenance(pointer, true) }, 'Every earlier write too'));
      provBox.scrollIntoView({ block: 'nearest' });
    } catch (error) {
      if (ticket !== provTicket) return;
      if (error instanceof NeedKey) { route(); return; }
      provBox.replaceChildren(provHead(pointer), el('p', { role: 'alert' }, error.message));
    }
  };

  // State viewer.
  const slider = el('input', { type: 'range', id: 'state-slider', min: '0', max: String(task.version), value: String(task.version), 'aria-label': 'State at step' });
  const stepNumber = el('input', { type: 'number', id: 'state-step-input', min: '0', max: String(task.version), value: String(task.version), 'aria-label': 'Step', style: null });
  const stateLabel = el('span', { id: 'state-step' });
  const stateTree = el('div', { class: 'json', id: 'state-tree' });
  const stateRaw = el('pre', { id: 'state-raw' });
  const stateBox = el('section', { 'aria-labelledby': 'state-heading' },
    el('h2', { id: 'state-heading' }, 'State'),
    el('div', { class: 'slider' }, el('span', { class: 'muted' }, 'step'), slider, stepNumber, stateLabel),
    stateTree,
    el('details', { id: 'state-raw-box' }, el('summary', null, 'Raw JSON'), stateRaw),
    provBox);
  let stateRequest = 0;
  const showState = async (step) => {
    const ticket = ++stateRequest;
    stateLabel.textContent = 'loading step ' + step + '…';
    try {
      const value = await api(base + '/steps/' + step + '/state');
      if (ticket !== stateRequest) return;
      stateTree.replaceChildren(jsonTree(value, null, 0, showProvenance, ''));
      stateRaw.textContent = JSON.stringify(value, null, 2);
      stateLabel.textContent = 'after step ' + step + (step === 0 ? ' (initial state)' : '');
      stateBox.dataset.step = String(step);
    } catch (error) {
      if (ticket !== stateRequest) return;
      stateLabel.textContent = 'step ' + step + ': ' + error.message;
    }
  };
  const setStep = debounce((step) => { slider.value = String(step); stepNumber.value = String(step); showState(step); }, 120);
  slider.addEventListener('input', () => setStep(Number(slider.value)));
  stepNumber.addEventListener('change', () => {
    const step = Math.max(0, Math.min(Number(slider.max), Math.floor(Number(stepNumber.value) || 0)));
    setStep(step);
  });

  // Search: the journal's observations, reasoning, actions and state writes (GET …/journal?q=),
  // newest first; each hit opens its step. The words stay in the address (#/tasks/…?q=).
  const searchInput = el('input', { type: 'search', id: 'journal-q', name: 'q', placeholder: 'an item, an order, a name…', 'aria-label': 'Search the journal' });
  const kindSelect = el('select', { id: 'journal-kind', name: 'kind', 'aria-label': 'Kind' },
    el('option', { value: '' }, 'everything'), HIT_KINDS.map((k) => el('option', { value: k }, k)));
  const searchStatus = el('p', { id: 'journal-status', class: 'muted', 'aria-live': 'polite' });
  const hitList = el('ol', { id: 'journal-hits', class: 'hits' });
  const searchMore = el('div', { class: 'pager' });
  let searchTicket = 0;
  const hitItem = (hit, words) => el('li', { class: 'hit', dataset: { step: String(hit.step), kind: hit.kind } },
    stepLink(hit.step), ' ', el('span', { class: 'badge kind' }, hit.kind),
    hit.pointer ? [' ', el('code', { class: 'pointer' }, hit.pointer)] : null,
    el('div', { class: 'hit-text' }, highlighted(compactText(hit.text, 600), words)));
  const runSearch = async (cursor) => {
    const words = searchInput.value.trim();
    const ticket = ++searchTicket;
    const address = new URLSearchParams(parseHash().params);
    if (words) address.set('q', words); else address.delete('q');
    history.replaceState(null, '', '#/tasks/' + enc(id) + (address.toString() ? '?' + address : ''));
    if (!words) { hitList.replaceChildren(); searchMore.replaceChildren(); searchStatus.textContent = ''; return; }
    const query = new URLSearchParams({ q: words, limit: String(HIT_PAGE) });
    if (kindSelect.value) query.set('kind', kindSelect.value);
    if (cursor) query.set('cursor', cursor);
    searchStatus.textContent = 'searching…';
    searchStatus.removeAttribute('role');
    try {
      const page = await api(base + '/journal?' + query);
      if (ticket !== searchTicket || signal.aborted) return;
      if (!cursor) hitList.replaceChildren();
      hitList.append(...page.hits.map((hit) => hitItem(hit, words)));
      const count = hitList.children.length;
      searchStatus.textContent = count
        ? count + (page.next_cursor ? '+' : '') + (count === 1 ? ' hit' : ' hits') + ', newest first'
        : 'No hits for “' + words + '”.';
      fill(searchMore, page.next_cursor ? el('button', { type: 'button', id: 'journal-more', onclick: () => runSearch(page.next_cursor) }, 'More hits') : null);
    } catch (error) {
      if (ticket !== searchTicket) return;
      if (error instanceof NeedKey) { route(); return; }
      searchStatus.textContent = error.message;
      searchStatus.setAttribute('role', 'alert');
    }
  };
  const searchBox = el('section', { 'aria-labelledby': 'search-heading' },
    el('h2', { id: 'search-heading' }, 'Search the journal'),
    el('form', {
      class: 'row', role: 'search', id: 'journal-search',
      onsubmit: (event) => { event.preventDefault(); runSearch(null); },
    }, el('label', { class: 'field' }, 'Words', searchInput), el('label', { class: 'field' }, 'In', kindSelect),
    el('button', { type: 'submit', id: 'journal-go' }, 'Search')),
    searchStatus, hitList, searchMore);

  // Timeline.
  const timelineBody = el('tbody');
  const pager = el('div', { class: 'pager' });
  const cursors = [];
  let currentCursor = null;
  let lastPage = false;
  const timeline = el('section', { 'aria-labelledby': 'timeline-heading' },
    el('h2', { id: 'timeline-heading' }, 'Timeline'),
    el('form', {
      class: 'row',
      onsubmit: (event) => {
        event.preventDefault();
        const n = Math.floor(Number(event.target.elements.step.value));
        if (n >= 1) openStepAlone(n);
      },
    }, el('label', { class: 'field' }, 'Go to step', el('input', { type: 'number', name: 'step', id: 'goto-step', min: '1' })), el('button', { type: 'submit' }, 'Open')),
    el('div', { id: 'step-alone' }),
    el('table', { id: 'timeline' },
      el('thead', null, el('tr', null,
        el('th', null, ''), el('th', { class: 'num' }, 'Step'), el('th', null, 'Verdict'), el('th', null, 'Action'),
        el('th', { class: 'num' }, 'Prompt tokens'), el('th', { class: 'num' }, 'Output tokens'),
        el('th', { class: 'num' }, 'Latency'), el('th', null, 'Author'), el('th', null, 'Time'))),
      timelineBody),
    pager);
  const loadSteps = async (cursor) => {
    const query = new URLSearchParams({ limit: String(STEP_PAGE) });
    if (cursor) query.set('cursor', cursor);
    const page = await api(base + '/steps?' + query);
    if (signal.aborted) return;
    const open = new Set([...timelineBody.querySelectorAll('tr.detail')].map((row) => row.dataset.step));
    timelineBody.replaceChildren();
    for (const step of page.steps) {
      timelineBody.append(stepRow(step));
      const row = timelineBody.lastElementChild;
      if (open.has(String(step.step))) toggleStep(row, step.step);
    }
    if (!page.steps.length) timelineBody.append(el('tr', null, el('td', { colspan: 9, class: 'muted' }, 'No steps yet.')));
    currentCursor = cursor;
    lastPage = !page.next_cursor;
    fill(pager,
      cursors.length ? el('button', { type: 'button', id: 'steps-prev', onclick: () => loadSteps(cursors.pop()) }, '← Previous steps') : null,
      el('span', { class: 'muted' }, page.steps.length ? 'steps ' + page.steps[0].step + '–' + page.steps[page.steps.length - 1].step + ' of ' + task.version : ''),
      page.next_cursor ? el('button', { type: 'button', id: 'steps-next', onclick: () => { cursors.push(currentCursor); loadSteps(page.next_cursor); } }, 'Next steps →') : null);
  };
  // The version a step began (an upgrade), and the one before it.
  const upgradeAt = (n) => {
    const versions = task.skill_versions || [];
    const at = versions.findIndex((v) => v.from_step === n);
    return at > 0 ? { from: versions[at - 1], to: versions[at] } : null;
  };
  const stepRow = (step) => {
    const toggle = el('button', { type: 'button', class: 'step-toggle', 'aria-expanded': 'false', 'aria-label': 'Details of step ' + step.step }, '▸');
    const upgrade = upgradeAt(step.step);
    const row = el('tr', { class: 'step ' + step.verdict + (upgrade ? ' upgrade' : ''), dataset: { step: String(step.step) } },
      el('td', null, toggle),
      el('td', { class: 'num' }, String(step.step)),
      el('td', null, step.verdict + (step.answers > 1 ? ' (' + step.answers + ' answers)' : '')),
      el('td', { class: 'mono action' }, step.action ? actionWords(actionSummary(step.action)) : ''),
      el('td', { class: 'num' }, String(step.prompt_tokens)),
      el('td', { class: 'num' }, step.output_tokens === null ? '' : String(step.output_tokens)),
      el('td', { class: 'num' }, step.latency_ms + ' ms'),
      el('td', { class: 'mono' }, step.author || 'model'),
      el('td', { title: step.created_at }, String(step.created_at).slice(11, 19)));
    toggle.addEventListener('click', () => toggleStep(row, step.step));
    if (!upgrade) return row;
    // The version boundary: the steps above ran the old version, this one and those below
    // the new (its detail shows the migration's diff).
    const boundary = el('tr', { class: 'version-boundary', dataset: { step: String(step.step) } },
      el('td', { colspan: 9 }, 'Skill upgraded: ', el('span', { class: 'mono' }, versionText(upgrade.from)), ' → ',
        el('span', { class: 'mono' }, versionText(upgrade.to))));
    const rows = document.createDocumentFragment();
    rows.append(boundary, row);
    return rows;
  };
  const toggleStep = (row, step) => {
    const next = row.nextElementSibling;
    const toggle = row.querySelector('.step-toggle');
    if (next && next.classList.contains('detail')) {
      next.remove();
      toggle.setAttribute('aria-expanded', 'false');
      toggle.textContent = '▸';
      return;
    }
    const cell = el('td', { colspan: 9 }, el('span', { class: 'muted' }, 'loading…'));
    row.after(el('tr', { class: 'detail', dataset: { step: String(step) } }, cell));
    toggle.setAttribute('aria-expanded', 'true');
    toggle.textContent = '▾';
    stepDetail(base, step, (n) => { slider.value = String(n); setStep(n); stateBox.scrollIntoView(); })
      .then((content) => cell.replaceChildren(content))
      .catch((error) => cell.replaceChildren(el('span', { role: 'alert' }, error.message)));
  };
  // A link to a step: opens it above the timeline (a plain click), or the task page at that
  // step (a new tab, a copied link).
  const stepLink = (step) => el('a', {
    href: '#/tasks/' + enc(id) + '?step=' + step, class: 'step-link', dataset: { step: String(step) },
    onclick: (event) => {
      if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
      event.preventDefault();
      openStepAlone(step);
      document.getElementById('step-alone').scrollIntoView({ block: 'start' });
    },
  }, 'step ' + step);
  const openStepAlone = (step) => {
    const box = document.getElementById('step-alone');
    box.replaceChildren(el('h3', null, 'Step ' + step), el('span', { class: 'muted' }, 'loading…'));
    stepDetail(base, step, (n) => { slider.value = String(n); setStep(n); })
      .then((content) => box.replaceChildren(el('h3', null, 'Step ' + step, ' ', el('button', { type: 'button', onclick: () => box.replaceChildren() }, 'Close')), el('div', { class: 'panel' }, content)))
      .catch((error) => box.replaceChildren(el('p', { role: 'alert' }, 'Step ' + step + ': ' + error.message)));
  };

  // Chart.
  const chartBox = el('div', { class: 'chart', id: 'task-chart' });
  const chart = el('section', { 'aria-labelledby': 'chart-heading' }, el('h2', { id: 'chart-heading' }, 'Prompt tokens per step'), chartBox);
  let chartLoaded = false;
  const loadChart = async () => {
    chartLoaded = true;
    const points = [];
    let cursor = null;
    chartBox.replaceChildren(el('span', { class: 'muted' }, 'loading…'));
    do {
      const query = new URLSearchParams({ limit: String(CHART_PAGE) });
      if (cursor) query.set('cursor', cursor);
      const page = await api(base + '/steps?' + query);
      if (signal.aborted) return;
      for (const step of page.steps) points.push([step.step, step.prompt_tokens]);
      cursor = page.next_cursor;
      if (cursor) chartBox.replaceChildren(el('span', { class: 'muted' }, 'loading… ' + points.length + ' steps'));
    } while (cursor);
    chartBox.replaceChildren(lineChart([{ name: 'prompt tokens', points }], { x: 'step', y: 'prompt tokens (o200k_base)', id: 'task-chart-svg', width: 560, height: 300 }));
  };
  const chartOffer = () => {
    if (task.version <= CHART_AUTO_STEPS) return loadChart();
    chartBox.replaceChildren(el('button', { type: 'button', id: 'chart-load', onclick: () => loadChart() }, 'Draw the chart (reads the summaries of all ' + task.version + ' steps)'));
    return null;
  };

  const renderHead = () => {
    head.replaceChildren(
      el('h1', null, 'Task ', el('span', { class: 'mono', id: 'task-id' }, task.id), ' ', el('span', { id: 'task-status' }, badge(task.status))),
      el('dl', { class: 'meta' },
        el('dt', null, 'skill'), el('dd', { id: 'task-skill' }, task.skill + ' ' + versionText(task.skill_version)),
        task.upgrade_scheduled ? [el('dt', { class: 'first' }, 'upgrade'), el('dd', { class: 'wide', id: 'task-upgrade' }, 'scheduled to ' + String(task.upgrade_scheduled).slice(0, 12) + ': it is committed once the waiting action is settled')] : null,
        el('dt', null, 'model'), el('dd', null, task.model),
        el('dt', null, 'context'), el('dd', null, task.context),
        el('dt', null, 'steps'), el('dd', { id: 'task-steps' }, String(task.version)),
        el('dt', null, 'tokens'), el('dd', { id: 'task-tokens', title: tokensTitle(task.totals) }, thousands(task.totals.prompt_tokens) + ' prompt + ' + thousands(task.totals.output_tokens) + ' output'),
        el('dt', null, 'reported'), el('dd', { id: 'task-reported' }, task.totals.reported ? thousands(task.totals.reported.input_tokens) + ' in + ' + thousands(task.totals.reported.output_tokens) + ' out' : NO_FIGURE),
        el('dt', null, 'cost'), el('dd', { id: 'task-cost' }, money(task.totals.cost_usd)),
        el('dt', null, 'labels'), el('dd', { class: 'mono' }, Object.entries(task.labels || {}).map(([k, v]) => k + ':' + v).join(' ') || '—'),
        el('dt', null, 'created'), el('dd', null, task.created_at),
        el('dt', null, 'updated'), el('dd', null, task.updated_at),
        task.parent ? [el('dt', { class: 'first' }, 'forked from'), el('dd', { class: 'wide' }, el('a', { href: '#/tasks/' + enc(task.parent.task) }, task.parent.task), ' at step ' + task.parent.step)] : null,
        task.outcome ? [el('dt', { class: 'first' }, 'outcome'), el('dd', { class: 'wide mono', id: 'task-outcome' }, compactJson(task.outcome, 600))] : null));
    renderPause();
  };

  const send = async (path, body, what) => {
    try {
      await api(base + '/' + path, { json: body });
      toast(what + ' sent; a worker delivers it at the task\'s next step.');
      live();
      loadMessages();
      return true;
    } catch (error) {
      if (error instanceof NeedKey) route(); else toast(what + ': ' + error.message, true);
      return false;
    }
  };
  // The decision asked for (re-drawn when the status changes), then the messages (drawn once,
  // so a live update never clears what is being typed).
  const decision = el('div', { class: 'panel pause', id: 'decision', hidden: true });
  const message = el('textarea', { id: 'message-text', 'aria-label': 'Message to the task' });
  pause.append(decision);
  const talk = el('section', { id: 'talk', 'aria-labelledby': 'messages-heading' },
    el('h2', { id: 'messages-heading' }, 'Messages'), messages, message,
    el('div', { class: 'row' }, el('button', {
      type: 'button', id: 'send-message', onclick: async () => {
        if (!message.value.trim()) return;
        if (await send('messages', { text: message.value }, 'Message')) message.value = '';
      },
    }, 'Send message')));
  let decisionFor = null;
  const renderPause = () => {
    if (decisionFor === task.status) return;
    decisionFor = task.status;
    const parts = [];
    if (task.status === 'awaiting_approval') {
      const reason = el('input', { type: 'text', id: 'reject-reason', placeholder: 'why (shown to the model)' });
      parts.push(el('h2', null, 'Waiting for approval'),
        el('div', { class: 'row' },
          el('button', { type: 'button', class: 'primary', id: 'approve', onclick: () => send('approve', {}, 'Approval') }, 'Approve'),
          el('label', { class: 'field' }, 'Reason', reason),
          el('button', { type: 'button', class: 'danger', id: 'reject', onclick: () => send('reject', { reason: reason.value }, 'Rejection') }, 'Reject')));
    }
    if (task.status === 'awaiting_input') {
      const reply = el('textarea', { id: 'reply-text', 'aria-label': 'Reply' });
      parts.push(el('h2', null, 'Waiting for a reply'), reply,
        el('div', { class: 'row' }, el('button', { type: 'button', class: 'primary', id: 'reply', onclick: () => { if (reply.value.trim()) send('reply', { text: reply.value }, 'Reply'); } }, 'Reply')));
    }
    decision.replaceChildren(...parts);
    decision.hidden = parts.length === 0;
  };

  const loadMessages = async () => {
    const list = await api(base + '/messages');
    if (signal.aborted) return;
    messages.replaceChildren(...list.messages.map((m) => el('li', { dataset: { kind: m.kind } },
      el('strong', null, m.kind), ' ', m.text ? '“' + m.text + '” ' : '',
      el('span', { class: 'muted' }, 'by ' + m.author + ', ' + m.created_at + ', ' + (m.summary || (m.delivered_step === null ? 'waiting for a worker' : 'for step ' + m.delivered_step))))));
    if (!list.messages.length) messages.append(el('li', { class: 'muted' }, 'none'));
  };

  const refreshTask = debounce(async () => {
    try {
      const previous = task;
      task = await api(base);
      if (signal.aborted) return;
      if (previous.status !== task.status || previous.version !== task.version || previous.updated_at !== task.updated_at) {
        const atEnd = Number(slider.value) === Number(slider.max);
        slider.max = String(task.version);
        stepNumber.max = String(task.version);
        if (atEnd && previous.version !== task.version) setStep(task.version);
        renderHead();
        loadMessages();
        if (lastPage) loadSteps(currentCursor);
        if (chartLoaded && task.version <= CHART_AUTO_STEPS) loadChart();
      }
    } catch (error) {
      if (error instanceof NeedKey) route();
    }
  }, 250);

  let following = false;
  const live = () => {
    if (following || signal.aborted) return;
    following = true;
    followEvents(base + '/events', () => refreshTask(), signal);
  };

  renderHead();
  main.append(el('div', { class: 'columns' }, el('div', null, searchBox, timeline), el('div', { class: 'side' }, stateBox, chart, talk)));
  await Promise.all([loadSteps(null), loadMessages(), showState(task.version)]);
  const step = Number(params.get('step'));
  if (step >= 1) openStepAlone(step);
  if (params.get('q')) { searchInput.value = params.get('q'); runSearch(null); }
  chartOffer();
  if (task.status !== 'completed' && task.status !== 'failed') live();
}

// An action as the CLI shows it (core's `Action::summary`): `store(item=item_4, shelf=shelf_9)`,
// a string argument as it is, any other as JSON; `finish` and `ask_user` with only their
// `result` and `question`. Arguments keep the order the API sends them in (a name that is a
// whole number comes first in a JavaScript object).
function actionSummary(action) {
  if (!action || typeof action !== 'object' || typeof action.tool !== 'string') return '-';
  const given = action.args === undefined ? {} : action.args;
  const field = (name) => (given && typeof given === 'object' && !Array.isArray(given) && given[name] !== undefined ? given[name] : null);
  let args = given;
  if (action.tool === 'finish') args = { result: field('result') };
  if (action.tool === 'ask_user') args = { question: typeof field('question') === 'string' ? field('question') : '' };
  let parts;
  if (args === null) parts = [];
  else if (typeof args === 'object' && !Array.isArray(args)) {
    parts = Object.entries(args).map(([name, value]) => name + '=' + (typeof value === 'string' ? value : JSON.stringify(value)));
  } else parts = [JSON.stringify(args)];
  return action.tool + '(' + parts.join(', ') + ')';
}

// The text as words that never break inside (an id such as item_4298 stays on one line; a
// line breaks only at a space), but for words too long for any column, which may.
function actionWords(text) {
  return text.split(/( +)/).filter((part) => part !== '').map((part) => (part.trim() === ''
    ? part
    : el('span', { class: part.length > 40 ? 'word long' : 'word' }, part)));
}

// One step in full: observation, answer, action and result, the state diff, rejections, the prompt.
async function stepDetail(base, step, showStateAt) {
  const [detail, before, after] = await Promise.all([
    api(base + '/steps/' + step),
    api(base + '/steps/' + (step - 1) + '/state').catch(() => undefined),
    api(base + '/steps/' + step + '/state').catch(() => undefined),
  ]);
  const box = el('div', { class: 'step-detail', dataset: { step: String(step) } });
  const accepted = detail.accepted;
  if (detail.observation !== null && detail.observation !== undefined) {
    box.append(el('h3', null, 'Observation'), el('pre', { class: 'observation' }, detail.observation));
  }
  const upgrade = accepted && accepted.author ? upgradeOf(accepted.output) : null;
  if (upgrade) {
    box.append(el('h3', null, 'Skill upgrade'),
      el('p', { class: 'upgrade-line' }, versionText(upgrade.from), ' → ', versionText(upgrade.to),
        upgrade.migrations && upgrade.migrations.length ? ', migrations from ' + upgrade.migrations.join(', ') : ', the state kept as it was',
        ', by ' + accepted.author));
  } else if (accepted) {
    box.append(el('h3', null, 'Answer (accepted, attempt ' + accepted.attempt + ')'), el('pre', { class: 'answer' }, accepted.output));
    box.append(el('p', { class: 'muted' }, tokenLine(accepted)));
  }
  if (detail.intent) {
    const intent = detail.intent;
    box.append(el('h3', null, 'Action'),
      el('pre', { class: 'action' }, intent.tool + ' ' + JSON.stringify(intent.args, null, 2)),
      el('p', { class: 'muted' }, intent.side_effect + ', ' + (intent.done ? (intent.ok ? 'succeeded' : 'failed') : 'not finished (running or waiting)')));
    if (intent.result !== null && intent.result !== undefined) box.append(el('h3', null, 'Result'), el('pre', { class: 'result' }, intent.result));
  }
  box.append(el('h3', null, 'State change'));
  if (after !== undefined && before !== undefined) {
    const changes = diffStates(before, after);
    box.append(diffList(changes));
  } else {
    box.append(el('p', { class: 'muted' }, 'no committed state at this step'));
  }
  if (accepted && accepted.patch !== null && accepted.patch !== undefined) {
    box.append(el('details', null, el('summary', null, 'Patch as written'), el('pre', { class: 'patch' }, JSON.stringify(accepted.patch, null, 2))));
  }
  if (detail.rejected.length) {
    box.append(el('h3', null, 'Rejected answers'));
    for (const answer of detail.rejected) {
      const errors = Array.isArray(answer.errors) ? answer.errors : [];
      box.append(el('div', { class: 'panel rejected-answer' },
        el('strong', null, 'attempt ' + answer.attempt), ' ', el('span', { class: 'muted' }, tokenLine(answer)),
        el('ul', { class: 'errors' }, errors.map((e) => el('li', null,
          el('code', null, e.kind || 'error'), ' ',
          el('code', { class: 'pointer' }, (e.document ? e.document + ' ' : '') + (e.pointer === undefined ? '' : e.pointer || '(root)')),
          ': ' + (e.message || compactJson(e))))),
        el('details', null, el('summary', null, 'The answer'), el('pre', null, answer.output))));
    }
  }
  const promptBox = el('div');
  const showPrompt = async (attempt) => {
    promptBox.replaceChildren(el('span', { class: 'muted' }, 'rebuilding…'));
    try {
      const query = attempt ? '?attempt=' + attempt : '';
      const prompt = await api(base + '/steps/' + step + '/prompt' + query);
      promptBox.replaceChildren(
        el('p', { class: 'muted' }, prompt.tokens + ' tokens, attempt ' + prompt.attempt + ', ' + (prompt.identical ? 'byte-identical to what the model received' : 'NOT identical to what the model received') + (prompt.sha256 ? ', sha256 ' + prompt.sha256 : '')),
        el('pre', { class: 'prompt' }, prompt.text));
    } catch (error) {
      promptBox.replaceChildren(el('span', { role: 'alert' }, error.message));
    }
  };
  box.append(el('div', { class: 'row' },
    el('button', { type: 'button', class: 'show-prompt', onclick: () => showPrompt(null) }, 'Show the exact prompt'),
    after !== undefined ? el('button', { type: 'button', class: 'show-state', onclick: () => showStateAt(step) }, 'State after this step') : null),
  promptBox);
  return box;
}

// A skill version as the page names it: skill.toml's version and the hash's first digits.
function versionText(version) {
  if (!version) return '';
  const hash = String(version.hash || '').slice(0, 12);
  return version.version ? version.version + ' (' + hash + ')' : hash;
}

// The upgrade an accepted answer records (a step an operator or API key wrote to move the
// task to another version of its skill), or null.
function upgradeOf(output) {
  try {
    const parsed = JSON.parse(output);
    return isObject(parsed) && isObject(parsed.upgrade) && parsed.upgrade.to ? parsed.upgrade : null;
  } catch (_) {
    return null;
  }
}

function tokenLine(answer) {
  const parts = [answer.prompt_tokens + ' prompt tokens (counted)'];
  if (answer.output_tokens !== null && answer.output_tokens !== undefined) parts.push(answer.output_tokens + ' output tokens');
  if (answer.usage && typeof answer.usage === 'object') {
    parts.push('provider: ' + Object.entries(answer.usage).filter(([, v]) => v !== null).map(([k, v]) => k.replace(/_tokens$/, '') + ' ' + v).join(', '));
  }
  parts.push(answer.latency_ms + ' ms');
  if (answer.author) parts.push('by ' + answer.author);
  return parts.join(' · ');
}

// ---------------------------------------------------------------- JSON: diff and tree

function isObject(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function pointerToken(key) {
  return String(key).replace(/~/g, '~0').replace(/\//g, '~1');
}

function sameJson(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// Added / changed / removed values, by JSON pointer, from `before` to `after`.
function diffStates(before, after, pointer, out) {
  pointer = pointer || '';
  out = out || [];
  if (isObject(before) && isObject(after)) {
    const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort();
    for (const key of keys) {
      const at = pointer + '/' + pointerToken(key);
      const had = Object.prototype.hasOwnProperty.call(before, key);
      const has = Object.prototype.hasOwnProperty.call(after, key);
      if (!had) out.push({ op: 'added', pointer: at, to: after[key] });
      else if (!has) out.push({ op: 'removed', pointer: at, from: before[key] });
      else diffStates(before[key], after[key], at, out);
    }
  } else if (Array.isArray(before) && Array.isArray(after)) {
    const length = Math.max(before.length, after.length);
    for (let i = 0; i < length; i++) {
      const at = pointer + '/' + i;
      if (i >= before.length) out.push({ op: 'added', pointer: at, to: after[i] });
      else if (i >= after.length) out.push({ op: 'removed', pointer: at, from: before[i] });
      else diffStates(before[i], after[i], at, out);
    }
  } else if (!sameJson(before, after)) {
    out.push({ op: 'changed', pointer, from: before, to: after });
  }
  return out;
}

function diffList(changes) {
  if (!changes.length) return el('p', { class: 'muted diff-empty' }, 'no change');
  return el('ul', { class: 'diff' }, changes.map((c) => el('li', { class: c.op, dataset: { pointer: c.pointer } },
    el('span', { class: 'op' }, c.op === 'added' ? '+ added' : c.op === 'removed' ? '− removed' : '~ changed'),
    el('span', { class: 'pointer' }, c.pointer || '(root)'), ' ',
    c.op === 'added' ? compactJson(c.to, 300) : c.op === 'removed' ? compactJson(c.from, 300) : compactJson(c.from, 140) + ' → ' + compactJson(c.to, 140))));
}

// A JSON value as a tree of <details>. With `why` (a function of a JSON pointer), every value
// but the root links to where it came from (`pointer` is the value's own).
function jsonTree(value, key, depth, why, pointer) {
  const label = key === null ? [] : [el('span', { class: 'key' }, key), ': '];
  const linked = why && key !== null;
  const whyLink = (content, cls) => el('a', {
    href: '#', class: 'prov ' + cls, dataset: { pointer }, title: 'Where ' + pointer + ' came from',
    onclick: (event) => { event.preventDefault(); why(pointer); },
  }, content);
  if (isObject(value) || Array.isArray(value)) {
    const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
    const summary = Array.isArray(value) ? '[' + entries.length + ' items]' : '{' + entries.length + ' keys}';
    const node = el('details', { open: depth < 2 }, el('summary', null, label, el('span', { class: 'muted' }, summary),
      linked ? [' ', whyLink('why?', 'why')] : null));
    // Large collections open lazily, so a big state does not build thousands of nodes at once.
    const fill = () => {
      if (node.dataset.filled) return;
      node.dataset.filled = '1';
      node.append(...entries.map(([k, v]) => jsonTree(v, k, depth + 1, why, why ? pointer + '/' + pointerToken(k) : undefined)));
    };
    if (depth < 2) fill(); else node.addEventListener('toggle', fill);
    return node;
  }
  let cls = 'lit';
  if (typeof value === 'string') cls = 'str';
  else if (typeof value === 'number') cls = 'num';
  return el('div', { class: 'leaf' }, label, linked ? whyLink(JSON.stringify(value), cls) : el('span', { class: cls }, JSON.stringify(value)));
}

// Who wrote a value (a provenance write's author).
function authorText(author) {
  if (!author || typeof author !== 'object') return 'unknown';
  if (author.kind === 'model') return 'the model ' + author.model;
  if (author.kind === 'api_key') return 'API key ' + author.key;
  return compactJson(author, 120);
}

// `text` on one line (runs of white space as one space), cut to `max` characters.
function compactText(text, max) {
  const line = String(text).replace(/\s+/g, ' ').trim();
  return line.length > max ? line.slice(0, max - 1) + '…' : line;
}

// `text` with the query's words marked (<mark>, as text nodes: nothing is markup). A word
// matches as the search does: its runs of letters and digits, case folded.
function highlighted(text, words) {
  const tokens = [...new Set(String(words).toLowerCase().split(/[^\p{L}\p{N}]+/u).filter((t) => t))];
  if (!tokens.length) return [text];
  const escaped = tokens.map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  const pattern = new RegExp('(?<![\\p{L}\\p{N}])(' + escaped.join('|') + ')(?![\\p{L}\\p{N}])', 'giu');
  return String(text).split(pattern).map((part, i) => (i % 2 ? el('mark', null, part) : part)).filter((part) => part !== '');
}

// ---------------------------------------------------------------- batches

function money(usd) {
  return usd === null || usd === undefined ? NO_FIGURE : '$' + usd.toFixed(4);
}

function tokensTitle(totals) {
  const parts = [thousands(totals.prompt_tokens) + ' prompt + ' + thousands(totals.output_tokens) + ' output tokens, counted (o200k_base), over ' + totals.answers + ' answers'];
  if (totals.reported) parts.push('provider: ' + thousands(totals.reported.input_tokens) + ' in + ' + thousands(totals.reported.output_tokens) + ' out');
  return parts.join('; ');
}

function duration(ms) {
  if (ms === null || ms === undefined) return NO_FIGURE;
  const s = Math.round(ms / 1000);
  if (s < 60) return s + ' s';
  const m = Math.floor(s / 60);
  if (m < 60) return m + ' min ' + (s % 60) + ' s';
  return Math.floor(m / 60) + ' h ' + (m % 60) + ' min';
}

function percent(rate) {
  return rate === null || rate === undefined ? NO_FIGURE : (rate * 100).toFixed(1) + '%';
}

async function batchList(main, params, signal) {
  const cursor = params.get('cursor') || '';
  main.append(el('h1', null, 'Batches'));
  const query = new URLSearchParams({ limit: '50' });
  if (cursor) query.set('cursor', cursor);
  const page = await api('/v1/batches?' + query);
  if (signal.aborted) return;
  const tbody = el('tbody', null, page.batches.map((b) => el('tr', { dataset: { batch: b.id } },
    el('td', { class: 'mono' }, el('a', { href: '#/batches/' + enc(b.id), class: 'batch-link' }, b.id)),
    el('td', null, b.name), el('td', null, badge(b.state)), el('td', null, b.skill || NO_FIGURE),
    el('td', null, b.model || NO_FIGURE), el('td', null, b.created_at))));
  if (!page.batches.length) tbody.append(el('tr', null, el('td', { colspan: 6, class: 'muted' }, 'No batches (POST /v1/tasks:batch makes one).')));
  main.append(el('table', { id: 'batch-table' },
    el('thead', null, el('tr', null, el('th', null, 'Batch'), el('th', null, 'Name'), el('th', null, 'State'),
      el('th', null, 'Skill'), el('th', null, 'Model'), el('th', null, 'Created'))), tbody),
  el('div', { class: 'pager' },
    cursor ? el('button', { type: 'button', onclick: () => history.back() }, '← Previous page') : null,
    page.next_cursor ? el('button', { type: 'button', id: 'batches-next', onclick: () => go('/batches', new URLSearchParams({ cursor: page.next_cursor })) }, 'Next page →') : null));
}

const COUNTS = ['queued', 'running', 'retry_waiting', 'completed', 'failed', 'paused', 'unknown'];
// Tasks read for the throughput chart, at most (a page is 500).
const THROUGHPUT_PAGES = 40;

async function batchPage(main, id, signal) {
  const view = await api('/v1/batches/' + enc(id));
  if (signal.aborted) return;
  const b = view.batch, m = view.metrics, c = view.counts;
  main.append(el('p', null, el('a', { href: '#/batches' }, '← Batches')),
    el('h1', null, 'Batch ', el('span', { class: 'mono', id: 'batch-id' }, b.id), ' ', badge(b.state)),
    el('dl', { class: 'meta' },
      el('dt', null, 'name'), el('dd', null, b.name),
      el('dt', null, 'skill'), el('dd', null, b.skill || NO_FIGURE),
      el('dt', null, 'model'), el('dd', null, b.model || NO_FIGURE),
      el('dt', null, 'created'), el('dd', null, new Date(b.created_at).toISOString().replace(/\.\d+Z$/, 'Z')),
      el('dt', null, 'tokens'), el('dd', { id: 'batch-tokens' }, thousands(m.tokens) + ' (' + thousands(m.prompt_tokens) + ' prompt tokens counted)'),
      el('dt', null, 'cost'), el('dd', { id: 'batch-cost' }, money(m.cost_usd)),
      el('dt', null, 'ETA'), el('dd', { id: 'batch-eta' }, m.eta_ms === 0 ? 'done' : duration(m.eta_ms)),
      el('dt', null, 'completion'), el('dd', null, percent(m.completion_rate)),
      b.stop_reason ? [el('dt', { class: 'first' }, 'stopped'), el('dd', { class: 'wide' }, b.stop_reason)] : null),
    el('p', null, el('a', { href: '#/?batch=' + enc(b.id), id: 'batch-tasks' }, 'Its ' + c.total + ' tasks →')));
  main.append(el('h2', null, 'Tasks by status'),
    el('table', { id: 'batch-counts', class: 'narrow' },
      el('thead', null, el('tr', null, el('th', null, 'Status'), el('th', { class: 'num' }, 'Tasks'))),
      el('tbody', null, COUNTS.map((name) => el('tr', { dataset: { status: name } },
        el('td', null, name.replace('_', '-')), el('td', { class: 'num count' }, String(c[name])))),
      el('tr', { dataset: { status: 'total' } }, el('th', null, 'total'), el('th', { class: 'num count' }, String(c.total))))));
  const rows = (list) => list.map((t) => el('tr', null,
    el('td', { class: 'mono' }, el('a', { href: '#/tasks/' + enc(t.id) }, t.id)),
    el('td', { class: 'mono' }, Object.entries(t.labels || {}).map(([k, v]) => k + ':' + (typeof v === 'string' ? v : JSON.stringify(v))).join(' ')),
    el('td', null, t.status), el('td', { class: 'num' }, String(t.steps)), el('td', { class: 'num' }, duration(t.duration_ms)),
    el('td', null, t.failure || '')));
  const head = () => el('thead', null, el('tr', null, el('th', null, 'Task'), el('th', null, 'Labels'), el('th', null, 'Status'),
    el('th', { class: 'num' }, 'Steps'), el('th', { class: 'num' }, 'Duration'), el('th', null, 'Failure')));
  if (view.slowest.length) main.append(el('h2', null, 'Slowest tasks'), el('table', { id: 'batch-slowest' }, head(), el('tbody', null, rows(view.slowest))));
  if (view.failed.length) {
    main.append(el('h2', null, 'Failed tasks (' + view.failed_total + ')'), el('table', { id: 'batch-failed' }, head(), el('tbody', null, rows(view.failed))));
  }
  const chartBox = el('div', { class: 'chart', id: 'batch-chart' }, el('span', { class: 'muted' }, 'loading…'));
  main.append(el('h2', null, 'Throughput: tasks finished per minute'), chartBox);
  // Finish times: the last update of each task that completed or failed.
  const finished = [];
  let cursor = null, pages = 0;
  do {
    const query = new URLSearchParams({ limit: '500', batch: b.id });
    if (cursor) query.set('cursor', cursor);
    const page = await api('/v1/tasks?' + query);
    if (signal.aborted) return;
    for (const t of page.tasks) if (t.status === 'completed' || t.status === 'failed') finished.push(Date.parse(t.updated_at));
    cursor = page.next_cursor;
    pages++;
  } while (cursor && pages < THROUGHPUT_PAGES);
  chartBox.replaceChildren(throughputChart(finished, cursor));
}

// Tasks finished per minute, from the first finish to the last (minute 0 = the first's).
function throughputChart(times, truncated) {
  if (!times.length) return el('p', { class: 'muted' }, 'No task has finished yet.');
  const first = Math.min(...times);
  const minutes = Math.floor((Math.max(...times) - first) / 60000);
  const counts = new Array(minutes + 1).fill(0);
  for (const t of times) counts[Math.floor((t - first) / 60000)]++;
  const points = counts.map((n, i) => [i, n]);
  const title = 'tasks finished per minute since ' + new Date(first).toISOString().slice(0, 16).replace('T', ' ') + ' UTC';
  const chart = lineChart([{ name: 'tasks finished', points }], { x: 'minute', y: 'tasks finished', integer: true, xMin: 0, xMax: Math.max(1, minutes), id: 'batch-chart-svg', width: 720, height: 300, title });
  chart.dataset.finished = String(times.length);
  if (truncated) chart.append(el('p', { class: 'muted' }, 'The first ' + times.length + ' finished tasks read (of ' + THROUGHPUT_PAGES * 500 + ' listed).'));
  return chart;
}

// ---------------------------------------------------------------- boards

async function boardList(main, signal) {
  main.append(el('h1', null, 'Boards'));
  const list = await api('/v1/boards');
  if (signal.aborted) return;
  const tbody = el('tbody', null, list.boards.map((b) => el('tr', { dataset: { board: b.id } },
    el('td', null, el('a', { href: '#/boards/' + enc(b.id), class: 'board-link' }, b.name)),
    el('td', { class: 'mono' }, b.id),
    el('td', { class: 'num version' }, String(b.version)),
    el('td', { class: 'num members' }, String(b.members)),
    el('td', { class: 'updated' }, b.updated_at))));
  if (!list.boards.length) tbody.append(el('tr', null, el('td', { colspan: 5, class: 'muted' }, 'No boards (skillstate board create, or POST /v1/boards).')));
  main.append(el('table', { id: 'board-table' },
    el('thead', null, el('tr', null, el('th', null, 'Board'), el('th', null, 'Id'), el('th', { class: 'num' }, 'Version'),
      el('th', { class: 'num' }, 'Members'), el('th', null, 'Updated'))), tbody));
}

function cloneJson(value) {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

// RFC 7396.
function applyMergePatch(target, patch) {
  if (!isObject(patch)) return cloneJson(patch);
  const result = isObject(target) ? Object.assign({}, target) : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = applyMergePatch(result[key], value);
  }
  return result;
}

function pointerTokens(pointer) {
  if (pointer === '') return [];
  if (!pointer.startsWith('/')) throw new Error('bad pointer ' + pointer);
  return pointer.slice(1).split('/').map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
}

// RFC 6902, on a copy of `doc`; throws when an operation does not apply.
function applyJsonPatch(doc, operations) {
  let root = cloneJson(doc);
  const parentOf = (pointer) => {
    const tokens = pointerTokens(pointer);
    const last = tokens.pop();
    let node = root;
    for (const t of tokens) {
      if (node === null || typeof node !== 'object' || !(t in node)) throw new Error('no ' + pointer);
      node = node[t];
    }
    return [node, last];
  };
  const get = (pointer) => {
    let node = root;
    for (const t of pointerTokens(pointer)) {
      if (node === null || typeof node !== 'object' || !(t in node)) throw new Error('no ' + pointer);
      node = node[t];
    }
    return node;
  };
  const add = (pointer, value) => {
    if (pointer === '') { root = value; return; }
    const [parent, key] = parentOf(pointer);
    if (Array.isArray(parent)) parent.splice(key === '-' ? parent.length : Number(key), 0, value);
    else if (isObject(parent)) parent[key] = value;
    else throw new Error('no parent of ' + pointer);
  };
  const remove = (pointer) => {
    const [parent, key] = parentOf(pointer);
    if (Array.isArray(parent)) parent.splice(Number(key), 1);
    else if (isObject(parent) && key in parent) delete parent[key];
    else throw new Error('no ' + pointer);
  };
  for (const op of operations) {
    if (op.op === 'add') add(op.path, cloneJson(op.value));
    else if (op.op === 'remove') remove(op.path);
    else if (op.op === 'replace') { get(op.path); if (op.path === '') root = cloneJson(op.value); else { remove(op.path); add(op.path, cloneJson(op.value)); } }
    else if (op.op === 'move') { const value = get(op.from); remove(op.from); add(op.path, value); }
    else if (op.op === 'copy') add(op.path, cloneJson(get(op.from)));
    else if (op.op === 'test') { if (!sameJson(get(op.path), op.value)) throw new Error('test failed at ' + op.path); }
    else throw new Error('unknown op ' + op.op);
  }
  return root;
}

function applyPatch(state, patch) {
  return Array.isArray(patch) ? applyJsonPatch(state, patch) : applyMergePatch(state, patch);
}

function authorCell(author) {
  if (!author) return '';
  if (author.kind === 'task') {
    return [el('a', { href: '#/tasks/' + enc(author.task) + '?step=' + author.step, class: 'author-task mono' }, author.task), ' step ' + author.step];
  }
  if (author.kind === 'key') return 'API key ' + author.key;
  return 'command line';
}

async function boardPage(main, id, signal) {
  let board = await api('/v1/boards/' + enc(id));
  id = board.id;
  const base = '/v1/boards/' + enc(id);
  const head = el('div');
  const members = el('ul', { id: 'board-members', class: 'board-members' });
  main.append(el('p', null, el('a', { href: '#/boards' }, '← Boards')), head);

  // State viewer: time travel through …/writes/{version}/state.
  const slider = el('input', { type: 'range', id: 'board-slider', min: '0', max: String(board.version), value: String(board.version), 'aria-label': 'Board state at version' });
  const versionNumber = el('input', { type: 'number', id: 'board-version-input', min: '0', max: String(board.version), value: String(board.version), 'aria-label': 'Version' });
  const stateLabel = el('span', { id: 'board-version' });
  const stateTree = el('div', { class: 'json', id: 'board-state-tree' });
  const stateRaw = el('pre', { id: 'board-state-raw' });
  const stateBox = el('section', { id: 'board-state', 'aria-labelledby': 'board-state-heading' },
    el('h2', { id: 'board-state-heading' }, 'State'),
    el('div', { class: 'slider' }, el('span', { class: 'muted' }, 'version'), slider, versionNumber, stateLabel),
    stateTree,
    el('details', null, el('summary', null, 'Raw JSON'), stateRaw));
  let stateRequest = 0;
  const showState = async (version) => {
    const ticket = ++stateRequest;
    stateLabel.textContent = 'loading version ' + version + '…';
    try {
      const value = await api(base + '/writes/' + version + '/state');
      if (ticket !== stateRequest) return;
      stateTree.replaceChildren(jsonTree(value, null, 0));
      stateRaw.textContent = JSON.stringify(value, null, 2);
      stateLabel.textContent = 'version ' + version + (version === 0 ? ' (initial state)' : '');
      stateBox.dataset.version = String(version);
    } catch (error) {
      if (ticket !== stateRequest) return;
      stateLabel.textContent = 'version ' + version + ': ' + error.message;
    }
  };
  const setVersion = debounce((version) => { slider.value = String(version); versionNumber.value = String(version); showState(version); }, 120);
  slider.addEventListener('input', () => setVersion(Number(slider.value)));
  versionNumber.addEventListener('change', () => {
    setVersion(Math.max(0, Math.min(Number(slider.max), Math.floor(Number(versionNumber.value) || 0))));
  });

  // The writes, oldest first, a page at a time; each page's diffs replay its patches on the
  // state before its first write (one state read per page).
  const writesBody = el('tbody');
  const pager = el('div', { class: 'pager' });
  const afters = [];
  let currentAfter = 0;
  let lastPage = false;
  const writes = el('section', { 'aria-labelledby': 'board-writes-heading' },
    el('h2', { id: 'board-writes-heading' }, 'Writes'),
    el('table', { id: 'board-writes' },
      el('thead', null, el('tr', null, el('th', { class: 'num' }, 'Version'), el('th', null, 'Author'),
        el('th', null, 'When'), el('th', null, 'Rebased'), el('th', null, 'Change'))),
      writesBody),
    pager);
  const loadWrites = async (after) => {
    const query = new URLSearchParams({ limit: String(WRITE_PAGE), after: String(after) });
    const [page, before] = await Promise.all([
      api(base + '/writes?' + query),
      api(base + '/writes/' + after + '/state').catch(() => undefined),
    ]);
    if (signal.aborted) return;
    let state = before;
    writesBody.replaceChildren(...page.writes.map((w) => {
      let change;
      if (state !== undefined) {
        try {
          const next = applyPatch(state, w.patch);
          change = diffList(diffStates(state, next));
          state = next;
        } catch (error) {
          state = undefined;
        }
      }
      if (change === undefined) change = el('pre', { class: 'patch' }, JSON.stringify(w.patch, null, 2));
      return el('tr', { class: 'write', dataset: { version: String(w.version) } },
        el('td', { class: 'num' }, el('button', { type: 'button', class: 'show-version', title: 'Show the state at version ' + w.version, onclick: () => { setVersion(w.version); stateBox.scrollIntoView(); } }, String(w.version))),
        el('td', { class: 'author' }, authorCell(w.author)),
        el('td', { title: w.created_at }, String(w.created_at).replace('T', ' ').slice(0, 19)),
        el('td', { class: 'rebased' }, w.rebased_from === null || w.rebased_from === undefined ? '' : 'rebased from ' + w.rebased_from),
        el('td', { class: 'change' }, change));
    }));
    if (!page.writes.length) writesBody.append(el('tr', null, el('td', { colspan: 5, class: 'muted' }, 'No writes yet.')));
    currentAfter = after;
    lastPage = page.next_after === null || page.next_after === undefined;
    fill(pager,
      afters.length ? el('button', { type: 'button', id: 'writes-prev', onclick: () => loadWrites(afters.pop()) }, '← Earlier writes') : null,
      el('span', { class: 'muted' }, page.writes.length ? 'versions ' + page.writes[0].version + '–' + page.writes[page.writes.length - 1].version + ' of ' + board.version : ''),
      lastPage ? null : el('button', { type: 'button', id: 'writes-next', onclick: () => { afters.push(currentAfter); loadWrites(page.next_after); } }, 'Later writes →'));
  };

  const renderHead = () => {
    head.replaceChildren(
      el('h1', null, 'Board ', el('span', { id: 'board-name' }, board.name)),
      el('dl', { class: 'meta' },
        el('dt', null, 'id'), el('dd', { class: 'mono' }, board.id),
        el('dt', null, 'version'), el('dd', { id: 'board-version-now' }, String(board.version)),
        el('dt', null, 'created'), el('dd', null, board.created_at),
        el('dt', null, 'updated'), el('dd', { id: 'board-updated' }, board.updated_at)),
      el('h2', null, 'Members (' + board.members.length + ')'), members);
    members.replaceChildren(...board.members.map((task) => el('li', { dataset: { task } }, el('a', { href: '#/tasks/' + enc(task), class: 'mono member-link' }, task))));
    if (!board.members.length) members.append(el('li', { class: 'muted' }, 'No task attached (skillstate run --board).'));
  };

  const refresh = debounce(async () => {
    try {
      const previous = board;
      board = await api(base);
      if (signal.aborted) return;
      if (previous.version === board.version && previous.members.length === board.members.length) return;
      const atEnd = Number(slider.value) === Number(slider.max);
      slider.max = String(board.version);
      versionNumber.max = String(board.version);
      if (atEnd) setVersion(board.version);
      renderHead();
      if (lastPage) await loadWrites(currentAfter);
    } catch (error) {
      if (error instanceof NeedKey) route();
    }
  }, 250);

  renderHead();
  main.append(el('div', { class: 'columns' }, el('div', null, writes), el('div', { class: 'side' }, stateBox)));
  await Promise.all([loadWrites(0), showState(board.version)]);
  followEvents(base + '/events', () => refresh(), signal);
}

// ---------------------------------------------------------------- charts (inline SVG)

function niceStep(range, ticks) {
  const raw = range / Math.max(1, ticks);
  const power = Math.pow(10, Math.floor(Math.log10(raw || 1)));
  const unit = raw / power;
  return (unit <= 1 ? 1 : unit <= 2 ? 2 : unit <= 5 ? 5 : 10) * power;
}

// series: [{name, points: [[x, y], ...]}]; one polyline each, with its point count in data-points.
function lineChart(series, options) {
  const width = options.width || 860, height = options.height || 380;
  const left = 70, right = 20, top = 20, bottom = 46;
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  const xMin = options.xMin !== undefined ? options.xMin : Math.min(1, ...xs);
  const xMax = Math.max(options.xMax || 0, xMin + 1, ...xs);
  const yMax = Math.max(1, ...ys) * 1.05;
  const px = (x) => left + (x - xMin) / (xMax - xMin) * (width - left - right);
  const py = (y) => height - bottom - y / yMax * (height - top - bottom);
  const root = svg('svg', { viewBox: '0 0 ' + width + ' ' + height, width, height, role: 'img', 'aria-label': options.title || options.y, id: options.id || null });
  if (options.title) root.append(svg('title', null, options.title));
  const yStep = options.integer ? Math.max(1, niceStep(yMax, 6)) : niceStep(yMax, 6);
  for (let y = 0; y <= yMax; y += yStep) {
    root.append(svg('line', { class: 'grid', x1: left, x2: width - right, y1: py(y), y2: py(y) }),
      svg('text', { x: left - 6, y: py(y) + 4, 'text-anchor': 'end' }, String(Math.round(y))));
  }
  const xStep = Math.max(1, niceStep(xMax - xMin, 10));
  for (let x = Math.ceil(xMin / xStep) * xStep; x <= xMax; x += xStep) {
    root.append(svg('line', { class: 'grid', x1: px(x), x2: px(x), y1: top, y2: height - bottom }),
      svg('text', { x: px(x), y: height - bottom + 16, 'text-anchor': 'middle' }, String(x)));
  }
  root.append(svg('line', { class: 'axis', x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }),
    svg('line', { class: 'axis', x1: left, x2: left, y1: top, y2: height - bottom }),
    svg('text', { x: (left + width - right) / 2, y: height - 8, 'text-anchor': 'middle' }, options.x),
    svg('text', { x: 14, y: (top + height - bottom) / 2, 'text-anchor': 'middle', transform: 'rotate(-90 14 ' + (top + height - bottom) / 2 + ')' }, options.y));
  series.forEach((s, i) => {
    const points = s.points.map((p) => px(p[0]).toFixed(1) + ',' + py(p[1]).toFixed(1)).join(' ');
    root.append(svg('polyline', { class: 'series c' + (i % 5), points, dataset: null, 'data-name': s.name, 'data-points': String(s.points.length) },
      svg('title', null, s.name)));
  });
  const box = el('div', null, root);
  if (series.length > 1 || options.legend) {
    box.prepend(el('div', { class: 'legend' }, series.map((s, i) => el('span', null, el('span', { class: 'swatch c' + (i % 5) }), s.name + (s.note ? ' ' + s.note : '')))));
  }
  return box;
}

// ---------------------------------------------------------------- bench

async function benchPage(main, signal) {
  main.append(el('h1', null, 'Bench'));
  const area = el('div', { id: 'bench' });
  const file = el('input', { type: 'file', id: 'bench-file', accept: '.json,application/json' });
  file.addEventListener('change', () => {
    const chosen = file.files && file.files[0];
    if (!chosen) return;
    const reader = new FileReader();
    reader.onload = () => {
      try { renderBench(area, JSON.parse(String(reader.result)), chosen.name); } catch (error) { area.replaceChildren(el('p', { role: 'alert' }, chosen.name + ': ' + error.message)); }
    };
    reader.readAsText(chosen);
  });
  main.append(el('p', { class: 'row' }, el('label', { class: 'field' }, 'Open a results.json (skillstate bench writes it to bench-out/)', file)), area);
  const response = await fetch('/viewer/bench.json', { cache: 'no-store', signal });
  if (response.ok) {
    renderBench(area, await response.json(), 'the server’s results.json');
  } else {
    area.append(el('p', { class: 'muted' }, 'This server has no bench results (start it with skillstate view --bench <results.json>); open a file above.'));
  }
}

// Rust's `{:.N}`: exact decimal value, ties to even (toFixed rounds ties up).
function fixed(value, digits) {
  if (!Number.isFinite(value)) return String(value);
  const exact = Math.abs(value).toFixed(100);
  const dot = exact.indexOf('.');
  const rest = exact.slice(dot + 1 + digits);
  if (/^50*$/.test(rest)) {
    const kept = exact.slice(0, dot) + exact.slice(dot + 1, dot + 1 + digits);
    let n = BigInt(kept);
    if (n % 2n === 1n) n += 1n;
    let text = n.toString().padStart(digits + 1, '0');
    if (digits > 0) text = text.slice(0, text.length - digits) + '.' + text.slice(text.length - digits);
    return (value < 0 && n !== 0n ? '-' : '') + text;
  }
  return value.toFixed(digits);
}

function thousands(value) {
  const n = Math.sign(value) * Math.round(Math.abs(value));
  const digits = String(Math.abs(n));
  let out = '';
  for (let i = 0; i < digits.length; i++) {
    if (i > 0 && (digits.length - i) % 3 === 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? '-' + out : out;
}

function compact(value) {
  if (value >= 1000000) return fixed(value / 1000000, 2) + 'M';
  if (value >= 1000) return fixed(value / 1000, 1) + 'k';
  return fixed(value, 0);
}

const NO_FIGURE = '—';

function benchCell(g) {
  const prompt = g.prompt_mean ? thousands(g.prompt_mean.mean) + '±' + thousands(g.prompt_mean.sd) : NO_FIGURE;
  const total = g.total_tokens ? compact(g.total_tokens.mean) + '±' + compact(g.total_tokens.sd) : NO_FIGURE;
  let text = fixed(g.score.mean, 2) + '±' + fixed(g.score.sd, 2) + ' / ' + prompt + ' / ' + total;
  if (g.provider_input_tokens !== undefined && g.provider_input_tokens !== null) {
    text += ' / provider ' + compact(g.provider_input_tokens) + '+' + compact(g.provider_output_tokens || 0);
  }
  if (g.cost_usd !== undefined && g.cost_usd !== null) text += ' / $' + fixed(g.cost_usd, 4);
  if (g.recovered_runs !== undefined && g.recovered_runs !== null) {
    const recovery = g.recovery_steps ? fixed(g.recovery_steps.mean, 1) : NO_FIGURE;
    text += ' / rec ' + recovery + ' (' + g.recovered_runs + '/' + g.seeds + ')';
  }
  if (g.completed < g.seeds) text += ' (' + g.completed + '/' + g.seeds + ' ok)';
  return text;
}

function compareConditions(a, b) {
  if (a[0] !== b[0]) return a[0] - b[0];
  if (a[1] === b[1]) return 0;
  if (a[1] === null) return -1;
  if (b[1] === null) return 1;
  return a[1] < b[1] ? -1 : 1;
}

function renderBench(area, report, source) {
  const config = report.config;
  const groups = report.groups || [];
  const drift = (value) => (value === undefined ? null : value);
  const conditions = [];
  for (const g of groups) {
    const key = [g.noise, drift(g.drift)];
    if (!conditions.some((c) => c[0] === key[0] && c[1] === key[1])) conditions.push(key);
  }
  conditions.sort(compareConditions);
  const showNoise = conditions.some((c) => c[0] > 0);
  const showDrift = conditions.some((c) => c[1] !== null);
  const header = ['T'].concat(showNoise ? ['noise'] : [], showDrift ? ['drift'] : [], config.strategies);
  const rows = [];
  for (const [noise, d] of conditions) {
    for (const horizon of config.horizons) {
      const row = [String(horizon)];
      if (showNoise) row.push(String(noise));
      if (showDrift) row.push(d === null ? '-' : d);
      for (const strategy of config.strategies) {
        const g = groups.find((x) => x.horizon === horizon && x.noise === noise && drift(x.drift) === d && x.strategy === strategy);
        row.push(g ? benchCell(g) : '-');
      }
      rows.push(row);
    }
  }
  const title = config.environment + ': score / avg prompt tokens / total tokens per run, mean ± SD over ' + config.seeds.length + ' seed(s), model ' + config.model + (config.budget !== null && config.budget !== undefined ? ', context budget ' + config.budget : '');
  const parts = [el('p', { class: 'muted' }, 'From ' + source + '.'), el('h2', { id: 'bench-title' }, title)];
  parts.push(el('table', { id: 'bench-table' },
    el('thead', null, el('tr', null, header.map((h) => el('th', null, h)))),
    el('tbody', null, rows.map((row) => el('tr', null, row.map((c) => el('td', { class: 'mono' }, c)))))));
  const runs = groups.reduce((n, g) => n + g.seeds, 0);
  const failed = groups.reduce((n, g) => n + g.seeds - g.completed, 0);
  if (failed > 0) {
    parts.push(el('p', { class: 'muted' }, failed + ' of ' + runs + ' runs failed. (k/n ok): k of the cell’s n runs completed; the others failed (results.json gives each run’s status and reason). Scores count every run, a failed run scoring the events it handled before it stopped; token figures average only the runs that committed at least one step (' + NO_FIGURE + ' when none did).'));
  }
  const scaling = report.scaling || [];
  if (scaling.length) {
    parts.push(el('h2', null, 'Scaling at T=' + scaling[0].horizon + ' (linear fit of prompt tokens per step; total tokens ≈ a·T + b·T² across horizons)'));
    parts.push(el('table', { id: 'scaling-table' },
      el('thead', null, el('tr', null, ['strategy', 'intercept', 'slope/step', 'R²', 'growth over run', 'total tokens a', 'b', 'log-log exponent'].map((h) => el('th', null, h)))),
      el('tbody', null, scaling.map((s) => {
        const q = s.total_tokens_quadratic;
        const exponent = s.total_tokens_exponent === null || s.total_tokens_exponent === undefined ? '-' : fixed(s.total_tokens_exponent, 2);
        return el('tr', null, [s.strategy, fixed(s.prompt_per_step.intercept, 0), fixed(s.prompt_per_step.slope, 2), fixed(s.prompt_per_step.r_squared, 3),
          fixed(s.prompt_growth * 100, 1) + '%', q ? fixed(q.intercept, 0) : '-', q ? fixed(q.slope, 2) : '-', exponent].map((c) => el('td', { class: 'mono' }, c)));
      }))));
  }
  // The chart of `skillstate bench`'s prompt_tokens.svg: completed runs at the largest horizon,
  // the first noise level and drift condition, averaged over seeds step by step.
  const horizon = Math.max(...config.horizons);
  const noise = config.noise.length ? config.noise[0] : 0;
  const firstDrift = config.drifts && config.drifts.length ? config.drifts[0] : null;
  const series = config.strategies.map((strategy) => {
    const lines = (report.runs || []).filter((r) => r.status === 'completed' && r.horizon === horizon && r.noise === noise && drift(r.drift) === firstDrift && r.strategy === strategy)
      .map((r) => r.prompt_tokens_per_step);
    const steps = lines.length ? Math.min(...lines.map((l) => l.length)) : 0;
    const points = [];
    for (let i = 0; i < steps; i++) points.push([i + 1, lines.reduce((sum, l) => sum + l[i], 0) / lines.length]);
    return { name: strategy, note: lines.length ? '' : '(no completed run)', points };
  });
  const chartTitle = config.environment + ': prompt tokens per step (T=' + horizon + ', mean over ' + config.seeds.length + ' seed(s), model ' + config.model + ')';
  parts.push(el('h2', null, chartTitle),
    el('div', { class: 'chart', id: 'bench-chart' }, lineChart(series, { x: 'step', y: 'prompt tokens (o200k_base)', xMin: 1, xMax: Math.max(horizon, 2), legend: true, title: chartTitle })));
  area.replaceChildren(...parts);
}

// ---------------------------------------------------------------- start

window.addEventListener('hashchange', route);
document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('forget-key').addEventListener('click', () => {
    sessionStorage.removeItem(KEY_STORE);
    route();
  });
  document.addEventListener('keydown', (event) => {
    // "/" jumps to the task search, as in many list views.
    if (event.key === '/' && !/^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName)) {
      const search = document.getElementById('search-id');
      if (search) { event.preventDefault(); search.focus(); }
    }
  });
  route();
});
