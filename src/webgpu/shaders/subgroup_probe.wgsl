// What the subgroup variants assume, measured (Context::subgroup_lanes; only built where the device has
// subgroups): each invocation of one workgroup writes its subgroup's size and its lane, so that the host can
// check that a subgroup is consecutive invocations (lane = local index mod size) of one size.

struct Params {
  pad0: u32, pad1: u32, pad2: u32, pad3: u32,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> OUT: array<u32>;

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_size) size: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
  OUT[i + P.pad0] = size | (lane << 16u);  // P.pad0 is 0: every binding is used
}
