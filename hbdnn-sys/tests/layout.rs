//! Documented S100 sizes and offsets (docs/package-contract.md §9.2), checked at test time too so a failure
//! names the field.
use hbdnn_sys::*;
use std::mem::{align_of, offset_of, size_of};

#[test]
fn sys_mem_layout() {
    assert_eq!(size_of::<hbUCPSysMem>(), 24);
    assert_eq!(align_of::<hbUCPSysMem>(), 8);
    assert_eq!(offset_of!(hbUCPSysMem, phyAddr), 0);
    assert_eq!(offset_of!(hbUCPSysMem, virAddr), 8);
    assert_eq!(offset_of!(hbUCPSysMem, memSize), 16);
}

#[test]
fn tensor_properties_layout() {
    assert_eq!(size_of::<hbDNNTensorShape>(), 44);
    assert_eq!(offset_of!(hbDNNTensorShape, numDimensions), 40);
    assert_eq!(size_of::<hbDNNQuantiScale>(), 32);
    assert_eq!(offset_of!(hbDNNQuantiScale, scaleLen), 0);
    assert_eq!(offset_of!(hbDNNQuantiScale, scaleData), 8);
    assert_eq!(offset_of!(hbDNNQuantiScale, zeroPointLen), 16);
    assert_eq!(offset_of!(hbDNNQuantiScale, zeroPointData), 24);
    assert_eq!(size_of::<hbDNNTensorProperties>(), 176);
    assert_eq!(offset_of!(hbDNNTensorProperties, validShape), 0);
    assert_eq!(offset_of!(hbDNNTensorProperties, tensorType), 44);
    assert_eq!(offset_of!(hbDNNTensorProperties, scale), 48);
    assert_eq!(offset_of!(hbDNNTensorProperties, quantiType), 80);
    assert_eq!(offset_of!(hbDNNTensorProperties, quantizeAxis), 84);
    assert_eq!(offset_of!(hbDNNTensorProperties, alignedByteSize), 88);
    assert_eq!(offset_of!(hbDNNTensorProperties, stride), 96);
    assert_eq!(size_of::<[i64; 10]>(), 176 - 96);
}

#[test]
fn tensor_layout() {
    assert_eq!(size_of::<hbDNNTensor>(), 200);
    assert_eq!(offset_of!(hbDNNTensor, sysMem), 0);
    assert_eq!(offset_of!(hbDNNTensor, properties), 24);
}

#[test]
fn sched_param_layout() {
    assert_eq!(size_of::<hbUCPSchedParam>(), 32);
    assert_eq!(offset_of!(hbUCPSchedParam, priority), 0);
    assert_eq!(offset_of!(hbUCPSchedParam, customId), 8);
    assert_eq!(offset_of!(hbUCPSchedParam, backend), 16);
    assert_eq!(offset_of!(hbUCPSchedParam, deviceId), 24);
}

#[test]
fn fn_table_is_one_pointer_per_entry() {
    assert_eq!(
        size_of::<hbdnn_sys_fn_table>(),
        entry_points().len() * size_of::<usize>()
    );
}
