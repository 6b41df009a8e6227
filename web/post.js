// Appended to the module (--post-js): run(args) runs the memcalc command line in-process.
Module['run'] = function (args) {
  var sizes = args.map(function (a) { return lengthBytesUTF8(String(a)) + 1; });
  var total = sizes.reduce(function (x, y) { return x + y; }, 0);
  var buffer = _malloc(total + 1);
  var at = buffer;
  args.forEach(function (a, i) { stringToUTF8(String(a), at, sizes[i]); at += sizes[i]; });
  var status;
  try { status = _memcalc_run(buffer, total); } finally { _free(buffer); }
  return { status: status, out: UTF8ToString(_memcalc_out()), err: UTF8ToString(_memcalc_err()) };
};
// Writes a file into the in-memory file system, for --config and the other file options.
Module['writeFile'] = function (path, text) { FS.writeFile(path, text); };
