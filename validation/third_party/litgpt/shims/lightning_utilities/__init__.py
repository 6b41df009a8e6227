# SHIM, written here: stands for the package lightning-utilities, which this machine lacks.
