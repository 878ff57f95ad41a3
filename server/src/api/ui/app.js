// The cache page: polls the server's JSON endpoints every two seconds and draws what it reads.
// No library, no build step. URLs are relative, so the page works under a path prefix. The DOM
// is built from text nodes only (never from markup), since prompt text may reach it.
'use strict';

const KEY_STORAGE = 'radix-serve.key';
const POLL_MS = 2000;
const SVG = 'http://www.w3.org/2000/svg';
// The parts of a prompt, in the cache report's order, with their colours (app.css).
const PARTS = ['system', 'tools', 'user', 'assistant', 'reasoning', 'tool_call_arguments', 'tool', 'generation_prompt'];
const PART_NAMES = {
  system: 'system', tools: 'tools', user: 'user', assistant: 'assistant', reasoning: 'reasoning',
  tool_call_arguments: 'tool-call arguments', tool: 'tool results', generation_prompt: 'generation prompt',
  prompt: 'prompt (raw text)',
};
const REASONS = {
  new_content: 'new content from here',
  changed_content: 'the text changed here',
  rerendered_history: 'the same history rendered to other text',
  evicted: 'evicted from the cache',
  cache_disabled: 'cache off for this request',
  no_snapshot: 'no recurrent-state snapshot this far',
};

const state = { polls: 0, lastError: null, admin: false, rendered: {} };
window.radixUi = state;

// ---- small helpers ----

function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'data') Object.assign(el.dataset, v);
    else if (k === 'title') el.title = v;
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function s(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

const fmt = (n) => (n === null || n === undefined ? '–' : Math.round(n).toLocaleString('en-US'));
const pct = (x) => (x === null || x === undefined || !isFinite(x) ? '–' : (100 * x).toFixed(1) + '%');
function ms(x) {
  if (x === null || x === undefined) return '–';
  return x < 1000 ? Math.round(x) + ' ms' : (x / 1000).toFixed(2) + ' s';
}
function bytes(n) {
  if (!n) return '0 B';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + ' ' + units[i];
}
const clock = (unixMs) => new Date(unixMs).toLocaleTimeString('en-GB', { hour12: false });
const num = (label, value, cls) => h('span', { class: 'num' }, label + ' ', h('b', { class: cls }, value));

// ---- fetching, with the key kept in this tab's session storage ----

class KeyNeeded extends Error {}

async function getJson(path) {
  const key = sessionStorage.getItem(KEY_STORAGE);
  const headers = key ? { Authorization: 'Bearer ' + key } : {};
  const response = await fetch(path, { headers, cache: 'no-store', credentials: 'omit' });
  if (response.status === 401) throw new KeyNeeded('the key was refused or is missing');
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error && body.error.message ? body.error.message : response.statusText;
    throw new Error(path.split('?')[0] + ': ' + response.status + ' ' + message);
  }
  return body;
}

function showKeyForm(message) {
  const form = document.getElementById('key-form');
  form.hidden = false;
  if (message) document.getElementById('key-message').textContent = message;
  document.getElementById('key-input').focus();
}

function setupKeyForm() {
  const form = document.getElementById('key-form');
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const value = document.getElementById('key-input').value.trim();
    if (value) sessionStorage.setItem(KEY_STORAGE, value);
    document.getElementById('key-input').value = '';
    form.hidden = true;
    poll();
  });
  document.getElementById('key-forget').addEventListener('click', () => {
    sessionStorage.removeItem(KEY_STORAGE);
    document.getElementById('key-input').value = '';
    poll();
  });
  document.getElementById('key-button').addEventListener('click', () => {
    if (form.hidden) showKeyForm('Enter a key (an admin key also shows prompt text). It is kept in this tab only.');
    else form.hidden = true;
  });
}

// ---- charts (inline SVG) ----

const W = 320;
const H = 120;
const PAD = { l: 40, r: 6, t: 8, b: 18 };

function axes(svg, maxLabel, buckets) {
  svg.append(s('line', { x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b, class: 'axis' }));
  svg.append(s('text', { x: PAD.l - 4, y: PAD.t + 8, 'text-anchor': 'end', class: 'tick' }, maxLabel));
  svg.append(s('text', { x: PAD.l - 4, y: H - PAD.b, 'text-anchor': 'end', class: 'tick' }, '0'));
  if (buckets.length) {
    const t0 = buckets[0].start_unix * 1000;
    const t1 = buckets[buckets.length - 1].start_unix * 1000;
    svg.append(s('text', { x: PAD.l, y: H - 4, class: 'tick' }, clock(t0).slice(0, 5)));
    svg.append(s('text', { x: W - PAD.r, y: H - 4, 'text-anchor': 'end', class: 'tick' }, clock(t1).slice(0, 5)));
  }
}

function chartFrame(id, buckets) {
  const figure = document.getElementById(id);
  const old = figure.querySelector('svg, .empty');
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  if (old) old.replaceWith(svg); else figure.append(svg);
  if (!buckets.length) {
    svg.replaceWith(h('p', { class: 'empty' }, 'No requests in the last hour yet.'));
    return null;
  }
  return svg;
}

function xOf(i, n) {
  const span = W - PAD.l - PAD.r;
  return PAD.l + (n <= 1 ? span / 2 : (i * span) / (n - 1));
}

function drawTokens(buckets) {
  const svg = chartFrame('chart-tokens', buckets);
  if (!svg) return;
  const max = Math.max(1, ...buckets.map((b) => b.prompt_tokens));
  axes(svg, fmt(max), buckets);
  const span = W - PAD.l - PAD.r;
  const bw = Math.max(1, span / buckets.length - 1);
  const y = (v) => ((H - PAD.t - PAD.b) * v) / max;
  buckets.forEach((b, i) => {
    const x = PAD.l + (i * span) / buckets.length;
    const hc = y(b.cached_tokens);
    const hp = y(b.computed_tokens);
    const base = H - PAD.b;
    if (hc > 0) svg.append(s('rect', { x, y: base - hc, width: bw, height: hc, class: 'bar-cached' }));
    if (hp > 0) svg.append(s('rect', { x, y: base - hc - hp, width: bw, height: hp, class: 'bar-computed' }));
  });
}

function polyline(svg, points, cls) {
  // Gaps (null) break the line; lone points get a dot.
  let run = [];
  const flush = () => {
    if (run.length > 1) svg.append(s('polyline', { points: run.map((p) => p.join(',')).join(' '), class: cls }));
    for (const [x, y] of run) svg.append(s('circle', { cx: x, cy: y, r: 2, class: cls + '-dot' }));
    run = [];
  };
  for (const p of points) {
    if (p === null) flush(); else run.push(p);
  }
  flush();
}

function drawRatio(buckets) {
  const svg = chartFrame('chart-ratio', buckets);
  if (!svg) return;
  axes(svg, '100%', buckets);
  const y = (v) => H - PAD.b - (H - PAD.t - PAD.b) * v;
  const points = buckets.map((b, i) =>
    b.prompt_tokens > 0 ? [xOf(i, buckets.length), y(b.cached_tokens / b.prompt_tokens)] : null);
  polyline(svg, points, 'line-ratio');
}

function drawTtft(buckets) {
  const svg = chartFrame('chart-ttft', buckets);
  if (!svg) return;
  const values = buckets.flatMap((b) => [b.ttft_first_ms, b.ttft_later_ms]).filter((v) => v !== null);
  const max = Math.max(1, ...values);
  axes(svg, ms(max), buckets);
  const y = (v) => H - PAD.b - ((H - PAD.t - PAD.b) * v) / max;
  const series = (key) => buckets.map((b, i) => (b[key] === null ? null : [xOf(i, buckets.length), y(b[key])]));
  polyline(svg, series('ttft_first_ms'), 'line-first');
  polyline(svg, series('ttft_later_ms'), 'line-later');
}

// ---- totals ----

function drawTotals(cache, health) {
  const engine = (health && health.engine) || {};
  const cards = [
    ['prompt tokens', fmt(cache.prompt_tokens), 'total-prompt'],
    ['from the cache', fmt(cache.cached_tokens), 'total-cached'],
    ['computed', fmt(cache.prompt_tokens - cache.cached_tokens), 'total-computed'],
    ['hit ratio', pct(cache.hit_ratio), 'total-ratio'],
    ['running · waiting', fmt(engine.running) + ' · ' + fmt(engine.waiting), 'total-running'],
    ['evicted tokens', fmt(cache.evicted_tokens), 'total-evicted'],
  ];
  document.getElementById('totals').replaceChildren(
    ...cards.map(([label, value, cls]) => h('div', { class: 'card' }, h('div', { class: 'value ' + cls }, value), h('div', { class: 'label' }, label))));
}

// ---- recent requests ----

function partsOf(request) {
  if (request.parts) {
    return PARTS.map((name) => ({ name, ...request.parts[name] })).filter((p) => p.tokens > 0);
  }
  return [{ name: 'prompt', tokens: request.prompt_tokens, cached: request.cached_tokens, computed: request.computed_tokens }];
}

function bar(request, parts) {
  const total = Math.max(1, request.prompt_tokens);
  const el = h('div', { class: 'bar', title: 'prompt tokens by part' });
  for (const p of parts) {
    const seg = h('div', { class: 'seg part-' + p.name, title: `${PART_NAMES[p.name]}: ${fmt(p.tokens)} tokens, ${fmt(p.cached)} from the cache` });
    seg.style.width = (100 * p.tokens / total) + '%';
    const cached = h('div', { class: 'seg-cached' });
    cached.style.width = (p.tokens ? 100 * p.cached / p.tokens : 0) + '%';
    seg.append(cached);
    el.append(seg);
  }
  const stop = request.divergence && request.divergence.token;
  if (stop && request.reason) {
    const mark = h('div', { class: 'stop-mark', title: 'reuse stopped at token ' + fmt(stop) });
    mark.style.left = (100 * Math.min(stop, total) / total) + '%';
    el.append(mark);
  }
  return el;
}

function whereStopped(request) {
  if (request.status === 'waiting') return h('div', { class: 'where' }, 'waiting for admission');
  if (!request.reason) {
    const full = request.cached_tokens > 0;
    return h('div', { class: 'where ok' }, full ? 'full hit: every prompt token but the last came from the cache' : 'nothing cached, nothing to compare with');
  }
  const d = request.divergence || {};
  if (request.reason === 'new_content' && d.token === 0) {
    return h('div', { class: 'where' }, 'cold: nothing in the cache matched its start, every token computed');
  }
  let place = '';
  if (d.part === 'message') place = ` in message ${d.message_index} (${d.role})`;
  else if (d.part) place = ' in ' + (PART_NAMES[d.part] || d.part);
  const parts = [
    'reuse stopped at token ', h('b', { class: 'n-stop' }, fmt(d.token)), place, ': ',
    h('span', { class: 'reason reason-' + request.reason }, REASONS[request.reason] || request.reason),
  ];
  if (request.recomputed_for_snapshot) parts.push(` (${fmt(request.recomputed_for_snapshot)} cached tokens recomputed from the nearest snapshot)`);
  const where = h('div', { class: 'where' }, parts);
  if (d.before !== undefined || d.after !== undefined) {
    where.append(h('div', { class: 'text-pair' },
      h('code', { class: 'before' }, '…' + (d.before || '')), h('span', { class: 'cut' }, '|'),
      h('code', { class: 'after' }, (d.after || '') + '…'),
      d.previous_after ? h('span', { class: 'was' }, ' was: ', h('code', {}, (d.previous_after || '') + '…')) : null));
  }
  return where;
}

function drawRequest(r) {
  const parts = partsOf(r);
  const meta = [
    h('b', { class: 'rid' }, '#' + r.id), ' ', clock(r.unix_ms), ' · ',
    r.session ? h('span', { class: 'session' }, 'session ' + r.session) : null, r.session ? ' · ' : null,
    h('span', { class: 'tenant' }, 'tenant ' + r.tenant), ' · ',
    r.turn ? (r.turn === 'later' ? 'later turn' : 'first turn') + ' · ' : null,
    r.messages !== null ? r.messages + ' messages · ' : null,
    h('span', { class: 'status status-' + r.status }, r.status + (r.finish ? ' (' + r.finish + ')' : '')),
  ];
  const share = r.prompt_tokens ? r.cached_tokens / r.prompt_tokens : null;
  const numbers = h('div', { class: 'numbers' },
    num('prompt', fmt(r.prompt_tokens), 'n-prompt'),
    num('cached', fmt(r.cached_tokens), 'n-cached'), h('span', { class: 'share' }, pct(share)),
    num('computed', fmt(r.computed_tokens), 'n-computed'),
    r.restored_from_disk ? num('from disk', fmt(r.restored_from_disk), 'n-disk') : null,
    num('TTFT', ms(r.ttft_ms), 'n-ttft'),
    num('decode', r.decode_tokens_per_second === null ? '–' : r.decode_tokens_per_second.toFixed(1) + ' tok/s', 'n-decode'),
    num('generated', fmt(r.generated_tokens), 'n-generated'));
  const chips = h('div', { class: 'chips' }, parts.map((p) =>
    h('span', { class: 'chip', data: { part: p.name } },
      h('i', { class: 'swatch part-' + p.name }), PART_NAMES[p.name] + ' ',
      h('b', { class: 'n-part-tokens' }, fmt(p.tokens)), ' (',
      h('span', { class: 'n-part-cached' }, fmt(p.cached)), ' cached)')));
  if (r.parts_status === 'pending') chips.append(h('span', { class: 'note' }, 'parts: counting…'));
  if (r.parts_status === 'dropped') chips.append(h('span', { class: 'note' }, 'parts: not kept'));
  return h('li', { class: 'req', data: { id: r.id, status: r.status } },
    h('div', { class: 'meta' }, meta),
    bar(r, parts),
    numbers,
    chips,
    whereStopped(r),
    r.preview ? h('div', { class: 'preview' }, 'last message: ', h('code', {}, r.preview)) : null);
}

function drawRequests(data) {
  const list = document.getElementById('request-list');
  if (!data.requests.length) {
    list.replaceChildren(h('li', { class: 'empty' }, 'No requests yet: send one and it shows here.'));
    return;
  }
  list.replaceChildren(...data.requests.map(drawRequest));
}

function drawLegend() {
  document.getElementById('legend').replaceChildren(...PARTS.map((p) =>
    h('span', { class: 'chip' }, h('i', { class: 'swatch part-' + p }), PART_NAMES[p])));
}

// ---- the cache's shape ----

function meter(segments, total) {
  const el = h('div', { class: 'bar meter' });
  for (const [cls, value, title] of segments) {
    const seg = h('div', { class: 'seg ' + cls, title });
    seg.style.width = (total ? (100 * value) / total : 0) + '%';
    el.append(seg);
  }
  return el;
}

function drawPages(cache, health) {
  const e = (health && health.engine) || {};
  const total = e.pages_total || 0;
  const cached = e.pages_cached || 0;
  const free = e.pages_free || 0;
  const held = Math.max(0, total - free - cached);
  const size = e.page_size || cache.page_size || 1;
  document.getElementById('pages').replaceChildren(
    h('h4', {}, 'KV pages'),
    meter([['pages-held', held, 'held by running sequences'], ['pages-cached', cached, 'in the prefix cache'], ['pages-free', free, 'free']], total),
    h('div', { class: 'numbers' },
      num('running', fmt(held), 'n-pages-held'), num('cached', fmt(cached), 'n-pages-cached'),
      num('free', fmt(free), 'n-pages-free'), num('of', fmt(total), 'n-pages-total')),
    h('p', { class: 'hint' }, `${fmt(size)} token${size === 1 ? '' : 's'} a page; the cache holds ${fmt(cached * size)} tokens and gives pages back when running sequences need them.`));
}

function drawSnapshots(cache, data) {
  const el = document.getElementById('snapshots');
  if (!data.hybrid && !cache.snapshot_slots) {
    el.replaceChildren(h('h4', {}, 'Snapshots'), h('p', { class: 'hint' }, 'Dense model: every cached prefix is reusable as it is, no recurrent-state snapshots needed.'));
    return;
  }
  el.replaceChildren(
    h('h4', {}, 'Recurrent-state snapshots'),
    meter([['pages-cached', cache.snapshots, 'in use'], ['pages-free', Math.max(0, cache.snapshot_slots - cache.snapshots), 'free slots']], cache.snapshot_slots),
    h('div', { class: 'numbers' },
      num('snapshots', fmt(cache.snapshots), 'n-snapshots'), num('of slots', fmt(cache.snapshot_slots), 'n-snapshot-slots'),
      num('memory', bytes(cache.snapshot_bytes), 'n-snapshot-bytes'), num('evicted', fmt(cache.evicted_snapshots), 'n-snapshots-evicted')),
    h('p', { class: 'hint' }, 'A hybrid model resumes a cached prefix from the deepest snapshot at or before where its KV match ends.'));
}

function drawDisk(cache) {
  const d = cache.disk || {};
  const el = document.getElementById('disk');
  if (!d.enabled) {
    el.replaceChildren(h('h4', {}, 'Disk tier'), h('p', { class: 'hint' }, 'Off: start with --cache-dir to keep evicted pages on disk and across restarts.'));
    return;
  }
  el.replaceChildren(
    h('h4', {}, 'Disk tier'),
    meter([['pages-cached', d.bytes, 'used'], ['pages-free', Math.max(0, d.budget_bytes - d.bytes), 'free']], d.budget_bytes),
    h('div', { class: 'numbers' },
      num('size', bytes(d.bytes), 'n-disk-bytes'), num('of', bytes(d.budget_bytes), 'n-disk-budget'),
      num('files', fmt(d.files), 'n-disk-files'), num('tokens', fmt(d.tokens), 'n-disk-tokens'),
      num('restored', fmt(d.restored_tokens), 'n-disk-restored'), d.snapshots ? num('snapshot files', fmt(d.snapshots), 'n-disk-snapshots') : null));
}

function drawBranches(data) {
  const el = document.getElementById('branches');
  if (!data.branches.length) {
    el.replaceChildren(h('p', { class: 'hint' }, 'Nothing computed yet.'));
    return;
  }
  let longest = 1;
  const walk = (bs) => bs.forEach((b) => { longest = Math.max(longest, b.end); walk(b.children); });
  walk(data.branches);
  const rows = [];
  const add = (bs, depth) => {
    for (const b of bs) {
      const track = h('div', { class: 'track' });
      const span = h('div', { class: 'span' });
      span.style.left = (100 * b.start / longest) + '%';
      span.style.width = Math.max(0.5, 100 * b.tokens / longest) + '%';
      track.append(span);
      const label = h('div', { class: 'branch-label' },
        h('b', { class: 'n-branch-tokens' }, fmt(b.tokens)), ' tokens (', fmt(b.start), '–', fmt(b.end), ') · ',
        h('span', { class: 'n-branch-sequences' }, b.sequences), b.sequences === 1 ? ' sequence' : ' sequences',
        b.uses ? ` · reused ${b.uses}×` : '',
        b.more_children ? ` · ${b.more_children} more below` : '',
        b.head !== undefined ? h('code', { class: 'head' }, b.head) : null);
      // The label is indented by depth; the tracks stay aligned, so positions compare.
      label.style.paddingLeft = (depth * 0.9) + 'rem';
      const row = h('div', { class: 'branch' }, track, label);
      rows.push(row);
      add(b.children, depth + 1);
    }
  };
  add(data.branches, 0);
  el.replaceChildren(h('p', { class: 'hint' }, `${data.sequences} recently computed sequences (prompt and reply each), up to ${fmt(longest)} tokens:`), ...rows);
}

// ---- the loop ----

function setLive(text, ok) {
  const live = document.getElementById('live');
  live.textContent = text;
  live.className = 'live ' + (ok ? 'ok' : 'bad');
}

// Redraws a part only when its data changed, so that a selection or a hover survives a poll.
function changed(name, value) {
  const text = JSON.stringify(value);
  if (state.rendered[name] === text) return false;
  state.rendered[name] = text;
  return true;
}

let timer = null;

async function poll() {
  clearTimeout(timer);
  try {
    const [cache, health, data] = await Promise.all([getJson('v1/cache'), getJson('health'), getJson('v1/cache/requests?limit=30')]);
    state.admin = data.admin;
    document.getElementById('model').textContent = data.model + (data.admin ? ' · admin view' : '');
    if (changed('totals', [cache, health.engine])) {
      drawTotals(cache, health);
      drawPages(cache, health);
      drawSnapshots(cache, data);
      drawDisk(cache);
    }
    if (changed('timeline', data.timeline)) {
      drawTokens(data.timeline.buckets);
      drawRatio(data.timeline.buckets);
      drawTtft(data.timeline.buckets);
    }
    if (changed('requests', data.requests)) drawRequests(data);
    if (changed('branches', [data.branches, data.sequences])) drawBranches(data);
    state.lastError = null;
    state.polls += 1;
    document.body.dataset.polls = String(state.polls);
    setLive('live · ' + clock(Date.now()), true);
  } catch (error) {
    state.lastError = String(error.message || error);
    if (error instanceof KeyNeeded) {
      setLive('key needed', false);
      showKeyForm(sessionStorage.getItem(KEY_STORAGE)
        ? 'The server refused this key. Enter another.'
        : 'This server wants an API key (--api-key). It is kept in this tab\'s session storage only.');
      return; // no polling until a key is given
    }
    setLive('offline: ' + state.lastError, false);
  }
  if (!document.hidden) timer = setTimeout(poll, POLL_MS);
}

document.addEventListener('visibilitychange', () => {
  if (!document.hidden && document.getElementById('key-form').hidden) poll();
});

document.addEventListener('DOMContentLoaded', () => {
  setupKeyForm();
  drawLegend();
  poll();
});
