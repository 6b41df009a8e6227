# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. Empty: transformers' own is a lazy-import table;
# the modules here are imported by their full names.
