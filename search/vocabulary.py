"""The search's vocabulary: the names of its objectives, serving modes and sharding families.

The command line's options list them at start-up, and the searches check against them; this module
imports nothing, so both reach it without loading the searches (or numpy).
"""

TRAIN_OBJECTIVES = ("time", "cost", "energy", "devices")
SERVE_OBJECTIVES = ("cost", "energy", "devices", "latency", "throughput")
SERVE_MODES = ("colocated", "disaggregated")

# Sharding families the search may combine with each ZeRO stage (perfmodel.sharding):
#   flat    every sharded state over the whole dp x cp group (ZeRO, FSDP)
#   hsdp    the stage's states over the replicas of one topology level, replicated across (HSDP, MiCS,
#           Megatron's partial distributed optimizer)
#   hfsdp   weights and gradients over one level, optimizer states over all (Megatron-FSDP's hybrid FSDP)
#   levels  any nesting of weights within gradients within optimizer states (hfsdp and Frontier's three levels)
#   hpz     ZeRO++ secondary weight partition over a smaller level (zero 3)
#   qwz/qgz ZeRO++ quantized collectives (zero 3; numerics change, so searched only when named, like fp8)
SHARDING = ("flat", "hsdp", "hfsdp", "levels", "hpz", "qwz", "qgz")
