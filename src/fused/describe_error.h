// Turns the kernel's ErrorRecord into the Error the host throws: code and one clear line.
#pragma once
#include <string>

#include "device/diagnostics/error_record.h"
#include "epfuse/error.h"

namespace epfuse::fused {

ErrorCode error_code(const device::ErrorRecord& rec);
// e.g. "rank 1: timed out in linear1 waiting for arrivals of local expert 5 from all senders
// (expected 12, saw 7)". Throws nothing.
std::string describe_error(const device::ErrorRecord& rec);

}  // namespace epfuse::fused
