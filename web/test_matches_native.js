// One core, three faces: the WebAssembly build (memcalc_wasm.js, as the page runs it) and the native
// program print the same thing, byte for byte (stdout, stderr and exit status), for every preset under a
// few settings, the page's own runs (its tabs' fit, plan, fine-tuning and serving among them), parallel
// layouts, the catalogues and some errors.
//     node test_matches_native.js BUILD/web/memcalc_wasm.js BUILD/memcalc
'use strict';
const { spawnSync } = require('child_process');
const path = require('path');

const [modulePath, native] = process.argv.slice(2);
if (!modulePath || !native) {
  console.error('usage: node test_matches_native.js memcalc_wasm.js NATIVE_MEMCALC');
  process.exit(2);
}

function nativeRun(args) {
  const r = spawnSync(native, args, { encoding: 'utf8', maxBuffer: 1 << 28 });
  if (r.error) throw r.error;
  return { status: r.status, out: r.stdout, err: r.stderr };
}

require(path.resolve(modulePath))().then((memcalc) => {
  const started = Date.now();
  const presets = JSON.parse(nativeRun(['presets', '--format', 'json']).out).map((p) => p.name);
  const cases = [];
  for (const p of presets) {
    cases.push(['--preset', p, '--format', 'json']);
    cases.push(['--preset', p, '--seq', '512', '--micro-batch', '2', '--recompute', 'selective', '--format', 'json']);
    cases.push(['--preset', p, '--recompute', 'full', '--activations', 'architecture', '--attention', 'flash',
                '--format', 'json']);
  }
  const llama = ['--preset', 'llama-7b', '--seq', '4096'];
  cases.push(
    // What the page runs: the three modes at once, and the table for the device line.
    llama.concat(['--recompute', 'none,selective,full', '--format', 'json']),
    llama.concat(['--recompute', 'selective', '--gpu', 'h100-sxm']),
    llama.concat(['--recompute', 'full', '--timeline', '--format', 'json', '--gpu', 'a100-80gb']),
    llama.concat(['--dp', '8', '--zero', '3', '--format', 'json']),
    llama.concat(['--tp', '2', '--pp', '2', '--dp', '2', '--zero', '1', '--format', 'json']),
    llama.concat(['--recipe', 'fp32-adam', '--micro-batch', '4', '--format', 'json']),
    ['--preset', 'llama-2-70b', '--seq', '4096', '--tp', '8', '--pp', '4', '--dp', '2', '--recompute', 'selective', '--format', 'json'],
    // The page's tabs: fit, plan, fine-tuning and serving, as their forms run them.
    ['fit', '--preset', 'llama-3.2-1b', '--micro-batch', '1', '--multiple-of', '256', '--gpu', 'h100-sxm',
     '--format', 'json'],
    ['fit', '--preset', 'llama-7b', '--seq', '2048', '--multiple-of', '256', '--gpu', 'a100-80gb', '--format', 'json'],
    ['plan', '--preset', 'llama-7b', '--gpus', '8', '--seq', '1024', '--global-batch', '16', '--top', '5',
     '--gpu', 'h100-sxm', '--format', 'json'],
    llama.concat(['--train', 'qlora', '--lora-rank', '16', '--lora-targets', 'all-linear',
                  '--recompute', 'none,selective,full', '--format', 'json']),
    llama.concat(['--train', 'frozen', '--frozen', 'embeddings,attention', '--format', 'json']),
    ['serve', '--preset', 'llama-3-8b', '--context', '4096', '--batch', '8', '--tp', '1', '--weights', 'int4',
     '--kv-dtype', 'fp8', '--gpu', 'h100-sxm', '--format', 'json'],
    ['presets', '--format', 'json'], ['recipes', '--format', 'json'], ['gpus', '--format', 'json'],
    ['profiles', '--format', 'json'], ['--version'],
    // Errors: the same one line and exit status.
    ['--preset', 'no-such-model'], llama.concat(['--tp', '3']), ['--bogus'], ['--preset', 'llama-7b', '--seq', '0'],
  );
  let failed = 0;
  const statuses = {};  // how many cases end in each exit status, so errors cannot pass for results unnoticed
  // plan's "seconds" is how long its search took, which no two runs share.
  const untimed = (args, r) => (args[0] !== 'plan' ? r
    : Object.assign({}, r, { out: r.out.replace(/"seconds": [0-9.e+-]+/, '"seconds": 0') }));
  for (const args of cases) {
    const a = untimed(args, memcalc.run(args));
    const b = untimed(args, nativeRun(args));
    statuses[b.status] = (statuses[b.status] || 0) + 1;
    for (const k of ['status', 'out', 'err']) {
      if (a[k] !== b[k]) {
        failed += 1;
        console.log(`DIFFERENT ${k}: memcalc ${args.join(' ')}\n  wasm:   ${String(a[k]).slice(0, 300)}\n  native: ${String(b[k]).slice(0, 300)}`);
        break;
      }
    }
  }
  console.log(`${cases.length - failed} of ${cases.length} runs identical (${presets.length} presets; exit statuses ${JSON.stringify(statuses)}) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  process.exitCode = failed ? 1 : 0;
}).catch((e) => { console.error(e); process.exitCode = 1; });
