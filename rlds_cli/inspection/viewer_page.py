"""The fixed parts of the episode viewer's page: style, layout and the script that plays it.

Inline, so the page (:mod:`rlds_cli.inspection.viewer`) needs no server and no network.

The script reads the page's data (``<script type="application/json" id="rlds-data">``: cameras,
per-episode series, audit marks and statistics) and the frames that follow as
``<script type="text/plain" id="f{episode}-{camera}-{chunk}" data-n="...">`` elements, each of
:data:`~rlds_cli.inspection.viewer.FRAMES_PER_CHUNK` frames base64-encoded one by one (``data-n``:
each one's length in characters); frame ``t`` is shown as a ``data:`` URL of a slice. The page is
ready (``<html data-ready="true">``) when its first frames are shown. Plots are drawn once per
episode, min/max per pixel column (a long episode costs as much as a short one).
"""

from __future__ import annotations

__all__ = ["HEAD", "SCRIPT", "TAIL"]

#: Everything before the data: the page's style and layout (``{title}`` is filled in, escaped).
HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body{{font:13px/1.4 system-ui,sans-serif;margin:0;background:#fafafa;color:#222}}
header{{padding:8px 14px;background:#263238;color:#fff;display:flex;gap:16px;align-items:center;
  flex-wrap:wrap}}
header h1{{font-size:15px;margin:0}}
main{{padding:10px 14px}}
#cams{{display:flex;gap:10px;flex-wrap:wrap}}
figure{{margin:0;background:#fff;border:1px solid #ddd;padding:4px}}
figure img{{display:block;width:var(--w,224px);height:auto;image-rendering:pixelated;background:#eee}}
figcaption{{font-size:11px;color:#555;max-width:var(--w,224px);overflow:hidden;text-overflow:ellipsis}}
#controls{{display:flex;gap:10px;align-items:center;margin:10px 0 4px}}
#scrub{{flex:1}}
#step{{font-variant-numeric:tabular-nums;min-width:15em}}
#timeline{{width:100%;height:60px;display:block;background:#fff;border:1px solid #ddd;cursor:pointer}}
.badges span{{display:inline-block;padding:1px 6px;margin:2px;border-radius:8px;color:#fff;font-size:11px}}
#layout{{display:grid;grid-template-columns:minmax(0,1fr) 300px;gap:14px;margin-top:8px}}
.plot{{position:relative;background:#fff;border:1px solid #ddd;margin-bottom:6px}}
.plot canvas{{width:100%;height:80px;display:block}}
.plot .title{{font-size:11px;padding:2px 6px;color:#333;white-space:nowrap;overflow:hidden;
  text-overflow:ellipsis}}
.cursor{{position:absolute;top:0;bottom:0;width:1px;background:#d32f2f;pointer-events:none}}
table{{border-collapse:collapse;width:100%;background:#fff}}
td{{border-bottom:1px solid #eee;padding:2px 6px;vertical-align:top;font-variant-numeric:tabular-nums}}
td:first-child{{color:#555}}
#legend span{{margin-right:10px;font-size:11px}}
.note{{color:#777;font-size:11px}}
</style></head>
<body>
<header><h1 id="name"></h1><label>episode <select id="episode"></select></label>
<span id="badges" class="badges"></span></header>
<main>
<div id="cams"></div>
<div id="controls"><button id="play" type="button">play</button>
<input id="scrub" type="range" min="0" max="0" value="0" step="1"><span id="step"></span></div>
<canvas id="timeline"></canvas><div id="legend"></div>
<div id="layout"><div id="plots"></div>
<div><table id="stats"></table><p id="notes" class="note"></p></div></div>
</main>
"""

#: The viewer's script (after the data, before the frames).
SCRIPT = r"""<script>
(() => {
'use strict';
const D = JSON.parse(document.getElementById('rlds-data').textContent);
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
  '#bcbd22', '#17becf'];
const MARKS = {idle:'#9e9e9e', spike:'#d32f2f', frozen:'#1565c0', nonfinite:'#c2185b', end:'#2e7d32'};
const $ = (id) => document.getElementById(id);
const chunks = new Map();
let E = 0, T = 0, playing = false, last = 0, carry = 0, plots = [], pending = false;

function chunk(e, c, k) {
  const id = `f${e}-${c}-${k}`;
  let v = chunks.get(id);
  if (v) return v;
  const el = document.getElementById(id);
  if (!el) return null;
  const lens = el.dataset.n.split(',').map(Number), starts = [0];
  for (const n of lens) starts.push(starts[starts.length - 1] + n);
  const text = el.textContent;
  if (text.length !== starts[starts.length - 1]) return null;  // still being read
  v = {text, starts};
  if (chunks.size > 48) chunks.delete(chunks.keys().next().value);
  chunks.set(id, v);
  return v;
}

function frameSrc(e, c, t) {
  const ch = chunk(e, c, Math.floor(t / D.chunk));
  if (!ch) return null;
  const i = t % D.chunk;
  return 'data:' + D.cameras[c].mime + ';base64,' + ch.text.substring(ch.starts[i], ch.starts[i + 1]);
}

function fmt(v) {
  if (v === null || v === undefined) return 'nan';
  const a = Math.abs(v);
  return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(2) : String(+v.toFixed(4));
}

function drawPlot(p, n) {
  const cv = p.canvas, dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(cv.clientWidth * dpr)), h = Math.max(1, Math.round(cv.clientHeight * dpr));
  cv.width = w; cv.height = h;
  const g = cv.getContext('2d');
  let lo = Infinity, hi = -Infinity;
  for (const d of p.dims) for (const v of d) if (v !== null) { if (v < lo) lo = v; if (v > hi) hi = v; }
  if (!(lo <= hi)) { lo = -1; hi = 1; }
  if (lo === hi) { lo -= 1; hi += 1; }
  const pad = (hi - lo) * 0.05, y = (v) => h - 2 - (v - lo + pad) / (hi - lo + 2 * pad) * (h - 4);
  g.clearRect(0, 0, w, h);
  g.lineWidth = Math.max(1, dpr);
  p.dims.forEach((d, j) => {
    g.strokeStyle = COLORS[j % COLORS.length];
    g.beginPath();
    let open = false;
    for (let x = 0; x < w; x++) {  // min and max of the steps under each pixel column
      const a = Math.floor(x * n / w), b = Math.max(a + 1, Math.floor((x + 1) * n / w));
      let mn = Infinity, mx = -Infinity;
      for (let t = a; t < b && t < n; t++) {
        const v = d[t];
        if (v !== null) { if (v < mn) mn = v; if (v > mx) mx = v; }
      }
      if (mn > mx) { open = false; continue; }
      if (!open) { g.moveTo(x + 0.5, y(mn)); open = true; } else g.lineTo(x + 0.5, y(mn));
      if (mx !== mn) g.lineTo(x + 0.5, y(mx));
    }
    g.stroke();
  });
}

function drawTimeline(ep) {
  const cv = $('timeline'), dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(cv.clientWidth * dpr)), h = Math.max(1, Math.round(cv.clientHeight * dpr));
  cv.width = w; cv.height = h;
  const g = cv.getContext('2d'), rows = Math.max(1, ep.marks.length), rh = (h - 4) / rows;
  g.clearRect(0, 0, w, h);
  ep.marks.forEach((m, r) => {
    g.fillStyle = MARKS[m.kind] || '#555';
    for (const [a, b] of m.ranges) {
      g.fillRect(a / ep.length * w, 2 + r * rh, Math.max(dpr, (b - a) / ep.length * w), rh - 1);
    }
  });
  g.fillStyle = '#d32f2f';
  g.fillRect((T + 0.5) / ep.length * w - dpr / 2, 0, dpr, h);
}

function showEpisode(e) {
  E = e;
  const ep = D.episodes[e];
  $('scrub').max = String(ep.length - 1);
  $('badges').innerHTML = '';
  for (const f of ep.flags) {
    const s = document.createElement('span');
    s.textContent = f; s.style.background = MARKS[f.split(':')[0]] || '#ef6c00';
    $('badges').appendChild(s);
  }
  if (!ep.flags.length && D.audited) {
    const s = document.createElement('span');
    s.textContent = 'passes audit'; s.style.background = '#2e7d32';
    $('badges').appendChild(s);
  }
  const stats = $('stats'); stats.innerHTML = '';
  for (const [k, v] of ep.stats) {
    const tr = stats.insertRow();
    tr.insertCell().textContent = k; tr.insertCell().textContent = v;
  }
  $('notes').textContent = D.notes.join(' ');
  $('legend').innerHTML = '';
  for (const m of ep.marks) {
    const s = document.createElement('span');
    s.textContent = '\u25A0 ' + m.label; s.style.color = MARKS[m.kind] || '#555';
    $('legend').appendChild(s);
  }
  const box = $('plots'); box.innerHTML = ''; plots = [];
  for (const p of ep.plots) {
    const div = document.createElement('div'); div.className = 'plot';
    const title = document.createElement('div'); title.className = 'title';
    const cv = document.createElement('canvas'), cur = document.createElement('div');
    cur.className = 'cursor';
    div.append(title, cv, cur); box.appendChild(div);
    plots.push({p, title, canvas: cv, cursor: cur, dims: p.dims});
  }
  for (const q of plots) drawPlot(q, ep.length);
  seek(Math.min(T, ep.length - 1));
}

function showFrames() {
  pending = false;
  D.cameras.forEach((cam, c) => {
    const img = $('cam' + c), src = frameSrc(E, c, T);
    if (src === null) { pending = true; return; }
    if (img.dataset.step !== `${E}:${T}`) { img.src = src; img.dataset.step = `${E}:${T}`; }
  });
  if (pending) setTimeout(showFrames, 50);  // the browser is still reading that part of the page
}

function seek(t) {
  const ep = D.episodes[E];
  T = Math.max(0, Math.min(ep.length - 1, Math.round(t)));
  $('scrub').value = String(T);
  $('step').textContent = `step ${T} / ${ep.length - 1}   t = ${(T / D.fps).toFixed(2)} s`;
  showFrames();
  for (const q of plots) {
    q.cursor.style.left = ((T + 0.5) / ep.length * 100) + '%';
    const vals = q.dims.map((d) => fmt(d[T]));
    const shown = vals.length > 8 ? vals.slice(0, 8).join(', ') + ', \u2026' : vals.join(', ');
    q.title.textContent = `${q.p.title}: ${shown}`;
  }
  drawTimeline(ep);
}

function tick(now) {
  if (!playing) return;
  carry += (now - last) * D.fps / 1000; last = now;
  if (carry >= 1) {
    const ep = D.episodes[E], n = Math.floor(carry); carry -= n;
    if (T + n >= ep.length) { seek(ep.length - 1); play(false); return; }
    seek(T + n);
  }
  requestAnimationFrame(tick);
}

function play(on) {
  playing = on; $('play').textContent = on ? 'pause' : 'play';
  if (!on) return;
  if (T >= D.episodes[E].length - 1) seek(0);
  last = performance.now(); carry = 0; requestAnimationFrame(tick);
}

$('name').textContent = D.title;
D.episodes.forEach((ep, e) => {
  const o = document.createElement('option');
  o.value = String(e); o.textContent = `${ep.index} (${ep.length} steps)`;
  $('episode').appendChild(o);
});
D.cameras.forEach((cam, c) => {
  const fig = document.createElement('figure'), img = document.createElement('img');
  const cap = document.createElement('figcaption');
  img.id = 'cam' + c; img.alt = cam.key; cap.textContent = cam.key;
  fig.style.setProperty('--w', Math.max(160, Math.min(360, cam.width)) + 'px');
  fig.append(img, cap); $('cams').appendChild(fig);
});
$('episode').addEventListener('change', (ev) => showEpisode(+ev.target.value));
$('scrub').addEventListener('input', (ev) => seek(+ev.target.value));
$('play').addEventListener('click', () => play(!playing));
const tl = $('timeline');
const fromTimeline = (ev) => {
  const r = tl.getBoundingClientRect();
  seek((ev.clientX - r.left) / r.width * D.episodes[E].length - 0.5);
};
tl.addEventListener('mousedown', (ev) => {  // a click seeks; a drag scrubs
  fromTimeline(ev);
  window.addEventListener('mousemove', fromTimeline);
  const up = () => window.removeEventListener('mousemove', fromTimeline);
  window.addEventListener('mouseup', up, {once: true});
});
document.addEventListener('keydown', (ev) => {
  if (ev.target.tagName === 'SELECT' || ev.target.tagName === 'INPUT') return;  // they have their own keys
  if (ev.key === ' ') { play(!playing); ev.preventDefault(); }
  else if (ev.key === 'ArrowRight') seek(T + 1);
  else if (ev.key === 'ArrowLeft') seek(T - 1);
});
window.addEventListener('resize', () => {
  for (const q of plots) drawPlot(q, D.episodes[E].length);
  drawTimeline(D.episodes[E]);
});
window.rldsViewer = {  // for scripts and tests: what is shown, and the controls
  seek, play, showEpisode, get step() { return T; }, get episode() { return E; },
  frameSrc: (c) => frameSrc(E, c, T),
};

function ready() {  // the first frames shown: the page is ready, whatever is still being read
  const imgs = D.cameras.map((_, c) => $('cam' + c));
  if (pending || imgs.some((i) => !i.complete)) { setTimeout(ready, 10); return; }
  document.documentElement.dataset.ready = 'true';
}
showEpisode(0);
ready();
})();
</script>
"""

#: The page's end, after the frames.
TAIL = "</body></html>\n"
