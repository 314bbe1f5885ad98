"""plancache benchmarks: store costs, fleet simulation, real boots (GPU only)."""
