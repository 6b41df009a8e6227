# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md.
