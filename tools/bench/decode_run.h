// `epfuse bench --layers L [--graph]`: the multi-layer decode step on the GPU (bench/decode_step.h has
// its pure parts). L fused layers of one case's shape on one workspace, each with its own routing and
// one of S weight sets, each layer's output RMS-normalised (rms_norm.h) into the next layer's input;
// the step captured as one CUDA graph (--graph) or launched layer by layer, timed under the row's
// protocol, then replayed once more with new inputs and every layer's and norm's output checked.
#pragma once
#include "bench/options.h"
#include "bench/report.h"
#include "epfuse/communicator.h"

namespace epfuse::bench {

// Collective. Fills row's step_* fields (step_layers stays 0 for a case the step does not run: sizes
// the kernel runs padded, whose layers would each copy their weights). The single layer's job must be
// destroyed first: the step budgets the GPU's free memory for its weight sets.
// `reference_threads`: CPU threads of the float64 reference on this rank.
void run_decode_step(Communicator& comm, const BenchCase& bc, const BenchOptions& opts, int reference_threads,
                     BenchRow& row);

}  // namespace epfuse::bench
