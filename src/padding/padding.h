// Layers whose hidden or intermediate size is a multiple of 64 but not of the kernels' tiles (e.g.
// 2880): they run zero-padded (config.h). The sizes each implementation runs at, the block-scale
// re-layout (host, unit-tested on the CPU), the resizing copy (device) and the staging rows of the
// forwards.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "common/device_buffer.h"
#include "common/stream_turn.h"
#include "epfuse/config.h"
#include "epfuse/layer.h"
#include "epfuse/types.h"

namespace epfuse::padding {

// What every kernel tiles H and I by (one weight block, one k-block).
inline constexpr int kTileAlign = 128;
// The fused kernel's 128 x 256 tiles (FP8 always, bf16 at larger T) need H % 256: the FP8 tile runs
// nothing else, and where a fused layer is padded anyway its H pads this far, so that bf16 gets the
// wider tile too (docs/performance.md#padded-sizes-and-caller-quantised-x: 2944 ran the 128 x 128 tile 13% slower than 3072).
inline constexpr int kFusedHiddenAlign = 256;

inline int round_up(int n, int to) { return (n + to - 1) / to * to; }

// The sizes `impl` runs cfg at; every other field as it is. The identity on sizes its kernels tile
// (H and I multiples of kTileAlign; the fused FP8 kernel H of kFusedHiddenAlign). Other sizes: I up
// to kTileAlign, H up to kTileAlign (unfused) or kFusedHiddenAlign (fused).
LayerConfig padded_config(const LayerConfig& cfg, Impl impl);
bool needs_padding(const LayerConfig& cfg, Impl impl);

// Block scales as the caller stores them, [matrices, rows, cols] (float for ScaleFormat::kFp32, the
// UE8M0 exponent byte for kUe8m0), into [matrices, rows_pad, cols_pad] with scale 1 in the new
// entries (their weights are zero). Raw bytes in the caller's element type. rows_pad >= rows and
// cols_pad >= cols, else Error(kInternal).
std::vector<uint8_t> pad_block_scales(const void* scales, ScaleFormat format, int matrices, int rows, int cols,
                                      int rows_pad, int cols_pad);

// Device, on `stream`: dst [batches, dst_rows, dst_cols] = src [batches, src_rows, src_cols] where
// the element exists in src, zero elsewhere: pads (dst larger) or crops (dst smaller). Elements of
// elem_bytes (1 or 2); both row lengths multiples of 16 bytes and both pointers 16-byte aligned (the
// copy moves 16-byte vectors), else Error(kInternal).
void copy_resized(const void* src, int64_t batches, int src_rows, int src_cols, void* dst, int dst_rows, int dst_cols,
                  int elem_bytes, cudaStream_t stream);

// The x and y rows of padded forwards at the padded hidden size, on the current device, shared by the
// padded layers of one workspace (or owned by one layer). Its forwards take turns as the fused
// workspace's do (common/stream_turn.h): take() before the copy into the staging x rows (a second
// host thread waits there; the stream waits for the last forward's copies, in a capture at every
// replay), Held::done() after the copy out of the staging y rows.
class Stage {
 public:
  Stage(int max_tokens, int hidden);
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  bool fits(int max_tokens, int hidden) const { return max_tokens <= max_tokens_ && hidden <= hidden_; }
  bf16* x() { return buffer_.as<bf16>(); }
  bf16* y() { return buffer_.as<bf16>() + static_cast<size_t>(max_tokens_) * hidden_; }
  size_t bytes() const { return buffer_.bytes(); }
  detail::StreamTurn::Held take(cudaStream_t stream) { return turn_.take(stream); }

 private:
  int max_tokens_, hidden_;
  detail::DeviceBuffer buffer_;
  detail::StreamTurn turn_;
};

}  // namespace epfuse::padding
