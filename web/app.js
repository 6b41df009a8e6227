// The page: reads the form, runs memcalc (the WebAssembly build of the command line, memcalc_wasm.js)
// with the matching arguments and --format json, and shows what it prints. No number is computed here.
(function () {
  'use strict';

  var memcalc = null;       // the module: memcalc.run(args) -> {status, out, err}
  var lists = {};           // presets, recipes and gpus, as `memcalc NAME --format json` prints them
  var current = null;       // the shown result: {modes: {none: json, ...}, mode, args}
  var drawing = 0;          // bumped to stop an animation in progress
  var GB = 1e9;

  // The categories of the peak and of each step, in the order the command line's tables show them.
  var categories = [
    ['weights', 'weights', '#4e79a7'],
    ['master_weights', 'master weights', '#76a5d6'],
    ['optimizer_state', 'optimizer state', '#a0cbe8'],
    ['gradients', 'gradients', '#f28e2b'],
    ['kept_activations', 'kept activations', '#59a14f'],
    ['rebuilt_activations', 'rebuilt activations (recomputed layer)', '#e15759'],
    ['logits', 'logits and loss', '#b07aa1'],
    ['activation_gradient', 'activation gradient', '#edc948'],
    ['workspace', 'workspace', '#9c755f'],
    ['gathered_weights', 'gathered weights', '#bab0ac'],
    ['weight_copies', 'weight copies', '#86bcb6']
  ];

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) { e.appendChild(typeof c === 'string' ? document.createTextNode(c) : c); });
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }
  function grouped(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  function gb(bytes) { return (bytes / GB).toFixed(1) + ' GB'; }
  function amount(bytes) {
    if (bytes >= GB) return gb(bytes);
    if (bytes >= 1e6) return (bytes / 1e6).toFixed(1) + ' MB';
    if (bytes >= 1e3) return (bytes / 1e3).toFixed(1) + ' kB';
    return bytes + ' B';
  }
  function count(n) {
    if (n >= 1e12) return (n / 1e12).toFixed(2) + ' T';
    if (n >= 1e9) return (n / 1e9).toFixed(2) + ' B';
    if (n >= 1e6) return (n / 1e6).toFixed(1) + ' M';
    return grouped(n);
  }
  function table(node, head, rows, numeric) {
    node.textContent = '';
    node.appendChild(el('thead', {}, [el('tr', {}, head.map(function (h, i) {
      return el('th', numeric[i] ? { class: 'num' } : {}, [h]);
    }))]));
    node.appendChild(el('tbody', {}, rows.map(function (r) {
      var tr = el('tr', r.attrs || {}, r.cells.map(function (c, i) {
        return el('td', numeric[i] ? { class: 'num' } : {}, [String(c)]);
      }));
      return tr;
    })));
  }

  // ---- running memcalc ----

  function run(args) { return memcalc.run(args); }
  function listing(name) {
    var r = run([name, '--format', 'json']);
    if (r.status !== 0) throw new Error(r.err);
    return JSON.parse(r.out);
  }
  function value(id) { return $(id).value.trim(); }
  function checked(name) { return document.querySelector('input[name="' + name + '"]:checked').value; }

  // The model's arguments: a preset, or the pasted config.json.
  function modelArguments() {
    if (checked('source') === 'preset') return ['--preset', value('preset')];
    memcalc.writeFile('/config.json', $('config').value);
    return ['--config', '/config.json'];
  }

  // The arguments the estimate's form stands for, less --recompute and --format.
  function argumentsFromForm() {
    var args = modelArguments();
    if (value('seq')) args.push('--seq', value('seq'));
    if (value('micro-batch') && value('micro-batch') !== '1') args.push('--micro-batch', value('micro-batch'));
    if (value('recipe') !== 'mixed-adam') args.push('--recipe', value('recipe'));
    ['dp', 'tp', 'pp'].forEach(function (k) { if (value(k) && value(k) !== '1') args.push('--' + k, value(k)); });
    if (value('zero') !== '0') args.push('--zero', value('zero'));
    return args.concat(gpuArguments(), optionArguments());
  }

  // ---- the tabs: what each runs, and which of the form's fields it reads ----

  // estimate and finetune show the single estimate (finetune adds its options); the others run a
  // command of their own and show its JSON as tables.
  var TABS = {
    estimate: { command: null },
    fit: { command: 'fit', title: 'The largest that fits' },
    plan: { command: 'plan', title: 'The search' },
    finetune: { command: null },
    serve: { command: 'serve', title: 'Serving' }
  };
  var tab = 'estimate';

  // A field with data-if="ID:A B" counts (and shows) only while #ID's value is A or B.
  function applies(node) {
    var owner = node.closest('[data-if]');
    if (!owner) return true;
    var rule = owner.getAttribute('data-if').split(':');
    return rule[1].split(' ').indexOf(value(rule[0])) >= 0;
  }
  // The fields of the chosen tab's own options (each with data-flag and data-key), in form order.
  function optionFields() {
    return Array.from(document.querySelectorAll('fieldset[data-options="' + tab + '"] [data-flag]'));
  }
  function optionArguments() {
    var args = [];
    optionFields().forEach(function (e) {
      if (e.value.trim() && applies(e)) args.push(e.getAttribute('data-flag'), e.value.trim());
    });
    return args;
  }
  function gpuArguments() { return value('gpu') ? ['--gpu', value('gpu')] : []; }

  function chooseTab(name) {
    tab = TABS[name] ? name : 'estimate';
    document.querySelectorAll('#tabs button').forEach(function (b) {
      var on = b.getAttribute('data-tab') === tab;
      b.classList.toggle('active', on);
      b.setAttribute('aria-selected', on ? 'true' : 'false');
    });
    showFields();
  }
  function showFields() {
    document.querySelectorAll('fieldset[data-tabs]').forEach(function (f) {
      f.hidden = f.getAttribute('data-tabs').split(' ').indexOf(tab) < 0;
    });
    document.querySelectorAll('[data-if]').forEach(function (e) { e.hidden = !applies(e); });
  }

  // The settings a link carries (#tab=fit&preset=gpt2&gpu=h100-sxm&...), so that a shared link
  // opens the same answer. A pasted config.json stays out (it may be long): such a link names none.
  // The estimate's fields ride with the estimate and fine-tuning; each tab's own options with it.
  var COMMON = ['preset', 'gpu'];
  var ESTIMATE = ['seq', 'micro-batch', 'recipe', 'dp', 'tp', 'pp', 'zero'];
  function estimating() { return TABS[tab].command === null; }
  function settingsToLink() {
    var q = new URLSearchParams();
    q.set('tab', tab);
    if (checked('source') === 'preset') q.set('preset', value('preset'));
    q.set('gpu', value('gpu'));
    if (estimating()) {
      ESTIMATE.forEach(function (id) { q.set(id, value(id)); });
      q.set('recompute', checked('recompute'));
    }
    optionFields().forEach(function (e) { q.set(e.getAttribute('data-key'), e.value.trim()); });
    history.replaceState(null, '', '#' + q.toString());
  }
  // A value the page does not offer (a preset renamed since the link was made) keeps the default.
  function setField(e, text) {
    var before = e.value;
    e.value = text;
    if (e.tagName === 'SELECT' && e.value !== text) e.value = before;
  }
  function settingsFromLink() {
    var q = new URLSearchParams(location.hash.slice(1));
    chooseTab(q.get('tab') || 'estimate');
    COMMON.concat(estimating() ? ESTIMATE : []).forEach(function (id) {
      if (q.has(id)) setField($(id), q.get(id));
    });
    optionFields().forEach(function (e) {
      if (q.has(e.getAttribute('data-key'))) setField(e, q.get(e.getAttribute('data-key')));
    });
    if (q.has('preset')) document.querySelector('input[name="source"][value="preset"]').checked = true;
    var mode = document.querySelector('input[name="recompute"][value="' + q.get('recompute') + '"]');
    if (mode && estimating()) mode.checked = true;
    showFields();
  }
  function quoted(a) { return /^[\w.,\/=+-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'"; }

  function update() {
    if (!memcalc) return;
    settingsToLink();
    if (!estimating()) { answer(); return; }
    var args = argumentsFromForm();
    var mode = checked('recompute');
    $('command').textContent = 'memcalc ' + args.concat(['--recompute', mode, '--timeline']).map(quoted).join(' ');
    // The three recomputation modes in one run (the command line's sweep; its JSON holds each one's
    // whole timeline), so switching between them shows a result already computed.
    var r = run(args.concat(['--recompute', 'none,selective,full', '--format', 'json']));
    if (r.status !== 0) { showError(r.err); return; }
    var results = JSON.parse(r.out);
    if (!Array.isArray(results)) results = [results];
    var modes = {};
    results.forEach(function (x) { modes[x.settings.recompute] = x; });
    current = { modes: modes, args: args, device: null };
    if (value('gpu')) {
      // The command line's own verdict, from its table.
      var t = run(args.concat(['--recompute', mode]));
      var lines = t.out.split('\n');
      current.device = lines.filter(function (l) { return /^\s*(fits in|does not fit in) /.test(l); })
        .map(function (l) { return l.trim(); });
    }
    show(mode);
  }

  function showError(text) {
    $('error').textContent = text.trim();
    $('error').hidden = false;
    $('output').hidden = true;
    $('answer').hidden = true;
  }

  // ---- fit, plan and serving: the command's JSON, every figure of it, as tables ----

  var answers = 0;  // bumped as each answer is shown (data-done), for a test to wait on
  function answer() {
    var args = [TABS[tab].command].concat(modelArguments(), optionArguments(), gpuArguments());
    $('command').textContent = 'memcalc ' + args.map(quoted).join(' ');
    var r = run(args.concat(['--format', 'json']));
    if (r.status !== 0) { showError(r.err); return; }
    var holder = $('answer');
    holder.textContent = '';
    tables(holder, JSON.parse(r.out), [], TABS[tab].title);
    $('error').hidden = true;
    $('output').hidden = true;
    holder.hidden = false;
    holder.setAttribute('data-tab', tab);
    holder.setAttribute('data-done', ++answers);
  }

  // A figure as the page shows it: bytes with their GB, counts grouped, fractions to four places.
  function figure(key, v) {
    if (v === null) return '\u2014';
    if (typeof v === 'boolean') return v ? 'yes' : 'no';
    if (Array.isArray(v)) return v.join(', ');
    if (typeof v !== 'number') return String(v);
    if (/bytes$/.test(key)) return grouped(v) + ' (' + amount(v) + ')';
    return Number.isInteger(v) ? grouped(v) : String(Number(v.toPrecision(4)));
  }
  function isLeaf(v) {
    return v === null || typeof v !== 'object' || (Array.isArray(v) && !v.some(isObject));
  }
  function isObject(v) { return v !== null && typeof v === 'object' && !Array.isArray(v); }
  // The leaves under `v`, as [path, value], nested objects' keys joined with dots.
  function leaves(v, path) {
    if (isLeaf(v)) return [[path, v]];
    return Object.keys(v).reduce(function (all, k) { return all.concat(leaves(v[k], path.concat(k))); }, []);
  }
  // One cell: the raw value and its place in the JSON ride along (data-path, data-value).
  function cell(path, v) {
    return el('td', { class: typeof v === 'number' ? 'num' : '', 'data-path': path.join('/'),
                      'data-value': JSON.stringify(v) }, [figure(path[path.length - 1], v)]);
  }
  // An object: its figures as a two-column table, then each list of objects as a table of its
  // own, a row per item (a column per item where the items have many figures: plan's layouts).
  function tables(holder, j, path, title) {
    var scalars = [], objects = [], lists = [];
    Object.keys(j).forEach(function (k) {
      var v = j[k];
      if (Array.isArray(v) && !isLeaf(v)) lists.push(k);
      else if (isObject(v) && path.length === 0) objects.push(k);
      else scalars = scalars.concat(leaves(v, [k]));
    });
    if (scalars.length) {
      holder.appendChild(el(path.length ? 'h3' : 'h2', {}, [title]));
      var t = el('table', { class: 'numbers figures' }, [el('tbody', {}, scalars.map(function (x) {
        return el('tr', {}, [el('th', {}, [x[0].join(' ').replace(/_/g, ' ')]), cell(path.concat(x[0]), x[1])]);
      }))]);
      holder.appendChild(t);
    }
    objects.forEach(function (k) { tables(holder, j[k], path.concat(k), k.replace(/_/g, ' ')); });
    lists.forEach(function (k) { listTable(holder, j[k], path.concat(k), k.replace(/_/g, ' ')); });
  }
  function listTable(holder, items, path, title) {
    var rows = items.map(function (x, i) { return isObject(x) ? leaves(x, []) : [[[], x]]; });
    var keys = [];
    rows.forEach(function (r) {
      r.forEach(function (x) { var k = x[0].join('/'); if (keys.indexOf(k) < 0) keys.push(k); });
    });
    // An item's own figures first, then those of the objects inside it (fit's first_over/peak/...).
    var depth = function (k) { return k.split('/').length; };
    keys = keys.map(function (k, i) { return [depth(k), i, k]; })
      .sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; }).map(function (x) { return x[2]; });
    var at = rows.map(function (r) {
      var m = {};
      r.forEach(function (x) { m[x[0].join('/')] = x; });
      return m;
    });
    function body(k, i) {
      var x = at[i][k];
      if (!x) return el('td', {}, []);
      return cell(path.concat([String(i)], x[0]), x[1]);
    }
    var name = function (k) { return k.split('/').join(' ').replace(/_/g, ' '); };
    var t;
    if (keys.length > 12) {
      t = el('table', { class: 'numbers wide' }, [
        el('thead', {}, [el('tr', {}, [el('th', {}, [''])].concat(items.map(function (x, i) {
          return el('th', { class: 'num' }, [String(i + 1)]);
        })))]),
        el('tbody', {}, keys.map(function (k) {
          return el('tr', {}, [el('th', {}, [name(k)])].concat(items.map(function (x, i) { return body(k, i); })));
        }))]);
    } else {
      t = el('table', { class: 'numbers' }, [
        el('thead', {}, [el('tr', {}, keys.map(function (k) { return el('th', {}, [name(k)]); }))]),
        el('tbody', {}, items.map(function (x, i) {
          return el('tr', {}, keys.map(function (k) { return body(k, i); }));
        }))]);
    }
    holder.appendChild(el('h2', {}, [title + ' (' + items.length + ')']));
    holder.appendChild(el('div', { class: 'scroll' }, [t]));
  }

  // ---- showing a result ----

  function show(mode) {
    var j = current.modes[mode];
    $('error').hidden = true;
    $('answer').hidden = true;
    $('output').hidden = false;
    var p = j.parameters, s = j.state, peak = j.peak;

    $('parameters').textContent = count(p.total);
    $('parameters-exact').textContent = grouped(p.total) + ' (' + grouped(p.trainable) + ' trainable), ' + p.layers + ' layers';
    // Split over devices, the state shown is the device's with the peak (its pipeline stage), as the peak is.
    var devices = j.settings.parallel.devices;
    var rank = (j.ranks || []).filter(function (r) { return r.stage === peak.stage; })[0];
    var held = devices > 1 && rank ? rank.state : s;
    $('state').textContent = gb(held.bytes);
    $('state-note').textContent = s.bytes_per_parameter + ' bytes per parameter (' + j.settings.recipe + ')' +
      (held !== s ? '; per device, of ' + gb(s.bytes) + ' in all' : '');
    $('peak').textContent = gb(peak.bytes);
    $('peak-note').textContent = 'at ' + peak.step + ', recompute ' + mode + ' (' + grouped(peak.bytes) + ' B)';

    var gpu = (lists.gpus || []).filter(function (g) { return g.name === value('gpu'); })[0];
    var device = $('device');
    if (gpu && current.device) {
      var fits = current.device.length > 0 && current.device.every(function (l) { return /^fits/.test(l); });
      device.className = 'device ' + (fits ? 'fits' : 'over');
      device.textContent = gpu.description + ': ' + current.device.join('; ');
      device.hidden = false;
    } else {
      device.hidden = true;
    }

    var strip = $('modes');
    strip.textContent = '';
    strip.appendChild(el('span', {}, ['Peak by recomputation: ']));
    ['none', 'selective', 'full'].forEach(function (m) {
      if (!current.modes[m]) return;
      var b = el('button', { type: 'button', 'data-mode': m, class: m === mode ? 'active' : '' },
                 [m + ' ' + gb(current.modes[m].peak.bytes)]);
      b.addEventListener('click', function () {
        document.querySelector('input[name="recompute"][value="' + m + '"]').checked = true;
        changed();
      });
      strip.appendChild(b);
    });

    var settings = j.settings.parallel;
    var layout = settings.devices > 1 ? ', per device of ' + settings.devices : '';
    table($('breakdown'), ['category', 'bytes', ''], categories.filter(function (c) { return peak.by_category[c[0]] > 0; })
      .map(function (c) { return { cells: [c[1], grouped(peak.by_category[c[0]]), amount(peak.by_category[c[0]])] }; })
      .concat([{ attrs: { class: 'total' }, cells: ['peak', grouped(peak.bytes), gb(peak.bytes)] }]), [false, true, true]);
    $('breakdown-note').textContent = 'at ' + peak.step + layout;
    table($('state-table'), ['part', 'bytes', ''], [['weights', held.weights], ['master weights', held.master_weights],
      ['optimizer state', held.optimizer_state], ['gradients', held.gradients]]
      .map(function (r) { return { cells: [r[0], grouped(r[1]), amount(r[1])] }; })
      .concat([{ attrs: { class: 'total' }, cells: ['state', grouped(held.bytes), gb(held.bytes)] }]), [false, true, true]);
    $('state-table-note').textContent = held !== s ? 'per device' + (j.ranks.length > 1 ? ', pipeline stage ' + peak.stage : '') : '';

    table($('parameter-table'), ['part', 'tensor', 'shape', 'dims', 'count', ''], p.tensors.map(function (t) {
      return { cells: [t.part, t.tensor, t.shape, (t.dims || []).join(' x '), grouped(t.count),
                       t.per_layer ? 'x ' + p.layers + ' layers' : ''] };
    }), [false, false, false, false, true, false]);
    $('parameter-note').textContent = grouped(p.total) + ' in all; per layer ' + grouped(p.per_layer.total);

    var a = j.activations;
    table($('activation-table'), ['op', 'tensor', 'symbol', 'bytes', 'kept', 'why'], a.tensors.map(function (t) {
      return { attrs: t.kept ? {} : { class: 'dropped' },
               cells: [t.op, t.tensor, t.symbol, grouped(t.bytes), t.kept ? 'kept' : 'rebuilt', t.why || ''] };
    }), [false, false, false, true, false, false]);
    $('activation-note').textContent = a.model + ' (' + (a.formula || a.attention) + '): ' + amount(a.layer_bytes) +
      ' a layer, ' + amount(a.kept_layer_bytes) + ' kept; ' + gb(a.kept_bytes) + ' kept in all';

    current.gpu = gpu;
    drawTimeline(j, gpu);
  }

  // ---- the timeline: each step's memory as a stacked bar, drawn one step after another ----

  function drawTimeline(j, gpu) {
    var steps = j.timeline || [];
    var n = steps.length;
    var W = 960, H = 300, left = 56, bottom = 24, top = 10;
    var most = Math.max.apply(null, steps.map(function (s) { return s.bytes; }).concat([gpu ? gpu.memory_bytes : 0, 1]));
    // Zoomed, the axis starts near what every step holds (weights, master copy, optimiser state), so
    // the activations, gradients and the recomputed layer, which change from step to step, show.
    var lo = 0;
    if ($('zoom').checked && n > 0) {
      lo = Math.min.apply(null, steps.map(function (s) {
        return (s.by_category.weights || 0) + (s.by_category.master_weights || 0) + (s.by_category.optimizer_state || 0);
      }));
    }
    var tick = Math.pow(10, Math.floor(Math.log10(Math.max(most - lo, 1) / GB / 2))) * GB;
    if ((most - lo) / tick > 10) tick *= 5; else if ((most - lo) / tick > 5) tick *= 2;
    lo = Math.floor(lo / tick) * tick;
    var scale = (H - bottom - top) / Math.max(most - lo, 1);
    var barW = (W - left - 4) / Math.max(n, 1);
    var box = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': 'memory at each step of the timeline' });
    for (var y = lo; y <= most; y += tick) {
      var yy = H - bottom - (y - lo) * scale;
      box.appendChild(svg('line', { x1: left, x2: W, y1: yy, y2: yy, class: 'grid' }));
      var label = svg('text', { x: left - 6, y: yy + 4, 'text-anchor': 'end', class: 'axis' });
      label.textContent = Math.round(y / GB) + ' GB';
      box.appendChild(label);
    }
    var bars = [];
    steps.forEach(function (s, i) {
      var g = svg('g', { class: 'bar', 'data-step': s.step, 'data-bytes': s.bytes,
                         'data-rebuilt': s.by_category.rebuilt_activations || 0, 'data-index': i });
      var below = 0;  // bytes stacked so far
      categories.forEach(function (c) {
        var b = s.by_category[c[0]] || 0;
        var from = Math.max(below, lo);
        below += b;
        if (b <= 0 || below <= lo) return;
        var h = (below - from) * scale;
        g.appendChild(svg('rect', { x: left + i * barW + 0.5, y: H - bottom - (below - lo) * scale,
                                    width: Math.max(barW - 1, 0.5), height: h, fill: c[2], class: 'cat-' + c[0] }));
      });
      var title = svg('title');
      title.textContent = s.step + (s.microbatch > 1 ? ' (micro-batch ' + s.microbatch + ')' : '') + ': ' + gb(s.bytes);
      g.appendChild(title);
      g.addEventListener('mouseenter', function () { selectStep(i); });
      g.style.visibility = 'hidden';
      box.appendChild(g);
      bars.push(g);
    });
    if (gpu && gpu.memory_bytes >= lo) {
      var gy = H - bottom - (gpu.memory_bytes - lo) * scale;
      box.appendChild(svg('line', { x1: left, x2: W, y1: gy, y2: gy, class: 'device-line' }));
      var gl = svg('text', { x: W - 4, y: gy - 4, 'text-anchor': 'end', class: 'device-label' });
      gl.textContent = gpu.name + ' ' + gb(gpu.memory_bytes);
      box.appendChild(gl);
    }
    var phases = [['forward', 0], ['backward', 0]];
    phases.forEach(function (ph) {
      var k = steps.findIndex(function (s) { return s.step.indexOf(ph[0]) === 0; });
      if (k < 0) return;
      var t = svg('text', { x: left + k * barW, y: H - 6, class: 'axis' });
      t.textContent = ph[0] + ' →';
      box.appendChild(t);
    });
    var holder = $('timeline');
    holder.textContent = '';
    holder.appendChild(box);
    holder.setAttribute('data-steps', n);
    holder.setAttribute('data-drawn', 0);
    var stage = j.ranks && j.ranks.length > 1 ? ' of pipeline stage ' + j.peak.stage : '';
    $('timeline-note').textContent = n + ' steps' + stage + ', recompute ' + j.settings.recompute +
      (lo > 0 ? '; the axis starts at ' + Math.round(lo / GB) + ' GB' : '');

    $('legend').textContent = '';
    categories.forEach(function (c) {
      if (!steps.some(function (s) { return s.by_category[c[0]] > 0; })) return;
      $('legend').appendChild(el('span', {}, [el('i', { style: 'background:' + c[2] }), c[1]]));
    });

    current.bars = bars;
    current.steps = steps;
    $('step').max = Math.max(n - 1, 0);
    var peakIndex = steps.findIndex(function (s) { return s.bytes === j.peak.bytes; });
    reveal(bars, 0, n, peakIndex < 0 ? 0 : peakIndex, 12);
  }

  // Shows bars [from, to) one after another, `delay` ms apart, then selects step `select`.
  function reveal(bars, from, to, select, delay) {
    var generation = ++drawing;
    var i = from;
    function next() {
      if (generation !== drawing) return;
      if (i < to) {
        bars[i].style.visibility = 'visible';
        $('timeline').setAttribute('data-drawn', i + 1);
        if (delay > 30) selectStep(i);
        i += 1;
        setTimeout(next, delay);
      } else {
        selectStep(select);
        $('timeline').setAttribute('data-done', generation);
      }
    }
    next();
  }

  function selectStep(i) {
    var steps = current.steps, s = steps[i];
    if (!s) return;
    current.bars.forEach(function (b, k) { b.classList.toggle('selected', k === i); });
    $('step').value = i;
    var parts = categories.filter(function (c) { return s.by_category[c[0]] > 0; })
      .map(function (c) { return c[1].replace(/ \(.*/, '') + ' ' + amount(s.by_category[c[0]]); });
    $('step-label').textContent = s.step + (s.microbatch > 1 ? ' (micro-batch ' + s.microbatch + ')' : '') +
      ': ' + gb(s.bytes) + ' = ' + parts.join(' + ');
  }

  // ---- wiring ----

  function changed() {
    try { update(); } catch (e) { showError(String(e && e.message || e)); }
  }

  function fill(select, items, chosen, label) {
    items.forEach(function (x) {
      var o = el('option', { value: x.name }, [label(x)]);
      if (x.name === chosen) o.selected = true;
      select.appendChild(o);
    });
  }

  function start(module) {
    memcalc = module;
    lists.presets = listing('presets');
    lists.recipes = listing('recipes');
    lists.gpus = listing('gpus');
    $('version').textContent = run(['--version']).out.trim().replace(/^memcalc\s*/, '');
    fill($('preset'), lists.presets, 'llama-7b', function (x) { return x.name + ' (' + count(x.parameters) + ')'; });
    fill($('recipe'), lists.recipes, 'mixed-adam', function (x) { return x.name + ' (' + x.bytes_per_parameter + ' B/param)'; });
    fill($('gpu'), lists.gpus, 'h100-sxm', function (x) { return x.name + ' (' + gb(x.memory_bytes) + ')'; });
    var describe = function () {
      var p = lists.presets.filter(function (x) { return x.name === value('preset'); })[0];
      $('preset-description').textContent = p ? p.description : '';
    };
    describe();
    $('preset').addEventListener('change', function () {
      document.querySelector('input[name="source"][value="preset"]').checked = true;
      describe();
    });
    $('config').addEventListener('input', function () {
      document.querySelector('input[name="source"][value="config"]').checked = true;
    });
    $('config-file').addEventListener('change', function () {
      var f = this.files[0];
      if (!f) return;
      var reader = new FileReader();
      reader.onload = function () {
        $('config').value = reader.result;
        document.querySelector('input[name="source"][value="config"]').checked = true;
        changed();
      };
      reader.readAsText(f);
    });
    $('settings').addEventListener('change', changed);
    $('settings').addEventListener('submit', function (e) { e.preventDefault(); changed(); });
    $('config').addEventListener('input', debounce(changed, 400));
    ['seq', 'micro-batch', 'dp', 'tp', 'pp'].forEach(function (id) { $(id).addEventListener('input', debounce(changed, 300)); });
    $('zoom').addEventListener('change', function (e) {
      e.stopPropagation();
      if (current) drawTimeline(current.modes[checked('recompute')], current.gpu);
    });
    $('step').addEventListener('input', function () { drawing++; selectStep(Number(this.value)); });
    $('play').addEventListener('click', function () {
      current.bars.forEach(function (b) { b.style.visibility = 'hidden'; });
      // About four seconds in all, each step's breakdown shown as its bar appears.
      reveal(current.bars, 0, current.bars.length, Number($('step').value), Math.max(35, 4000 / current.bars.length));
    });
    window.addEventListener('hashchange', function () { settingsFromLink(); describe(); changed(); });
    document.querySelectorAll('#tabs button').forEach(function (b) {
      b.addEventListener('click', function () { chooseTab(b.getAttribute('data-tab')); changed(); });
    });
    $('train').addEventListener('change', showFields);
    document.querySelectorAll('fieldset[data-options] input').forEach(function (e) {
      e.addEventListener('input', debounce(changed, 300));
    });
    settingsFromLink();
    describe();
    $('loading').hidden = true;
    changed();
    document.body.setAttribute('data-ready', 'true');
  }

  function debounce(f, ms) {
    var t = null;
    return function () { clearTimeout(t); t = setTimeout(f, ms); };
  }

  createMemcalc().then(start).catch(function (e) {
    $('loading').textContent = 'memcalc could not start: ' + e;
  });
})();
