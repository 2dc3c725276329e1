// A shared-memory plan written as a sequence of regions: each region's offset is where the one
// before it ends, so a kernel's layout is read (and changed) as a list of sizes rather than as a
// column of hand-summed offsets. Used by sm80/plan.cuh and sm90/plan.cuh.
#pragma once

namespace attn {

struct Region {
    int off, bytes;
    constexpr int end() const { return off + bytes; }
};
constexpr Region first_region(int bytes) { return Region{0, bytes}; }
constexpr Region region_after(Region prev, int bytes) { return Region{prev.end(), bytes}; }

}  // namespace attn
