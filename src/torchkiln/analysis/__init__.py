"""What lowering, partitioning and conversion all ask of a graph: the converter and evaluator registries
(what is supported) and the static-value resolver (what is known at build time, what aliases what)."""
