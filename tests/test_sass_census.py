"""scripts/sass_census.py's parsing and counting (CPU; its compile needs NVRTC and cuobjdump,
which the device and the developers' machines have)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sass_census", ROOT / "scripts" / "sass_census.py")
census = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(census)

# the shape of cuobjdump -sass output: a header, then one instruction a line with its
# address in a comment and its encoding after it
SASS = """
        Function : _Z6kernelv
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                         /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                             /* 0x0000000000007919 */
        /*0020*/                   IMAD.SHL.U32 R2, R0, 0x4, RZ ;                 /* 0x0000000400027824 */
        /*0030*/                   LOP3.LUT R3, R2, 0x1c1c1c1c, RZ, 0xc0, !PT ;  /* 0x1c1c1c1c02037812 */
        /*0040*/                   F2FP.F16.E4M3.UNPACK_B R4, R3 ;                /* 0x0000000300047208 */
        /*0050*/                   HMUL2 R4, R4, R5.H0_H0 ;                        /* 0x2000000504047232 */
        /*0060*/                   HGMMA.64x64x16.F32 R24, R88, gdesc[UR36], RZ ;  /* 0x00e0002458187df0 */
        /*0070*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;            /* 0x000000100000780c */
        /*0080*/              @!P0 BRA 0x20 ;                                     /* 0xfffffffc00e08947 */
        /*0090*/                   R2UR UR4, R2 ;                                 /* 0x00000000020472ca */
        /*00a0*/                   UIADD3 UR4, UR4, 0x10, URZ ;                   /* 0x0000001004047890 */
        /*00b0*/               @P0 BRA 0xd0 ;                                     /* 0x0000000000000947 */
        /*00c0*/                   BRA 0x0 ;                                      /* 0xfffffff000007947 */
        /*00d0*/                   EXIT ;                                         /* 0x000000000000794d */
"""


def test_instructions_are_parsed_with_their_opcodes_guards_left_out():
    ins = census.parse_sass(SASS)
    assert [a for a, _, _ in ins] == list(range(0, 0xE0, 0x10))
    ops = [op for _, op, _ in ins]
    assert ops[2] == "IMAD.SHL.U32" and ops[8] == "BRA" and ops[11] == "BRA"  # "@!P0 BRA": the guard dropped
    assert ins[8][2].startswith("@!P0 BRA 0x20")


def test_loops_are_the_ranges_of_backward_branches_largest_first():
    ins = census.parse_sass(SASS)
    # BRA 0x20 at 0x80 (7 instructions), BRA 0x0 at 0xc0 (13); the forward BRA 0xd0 is none
    assert census.loops(ins) == [(0x0, 0xC0, 13), (0x20, 0x80, 7)]
    assert census.loops(ins, min_size=8) == [(0x0, 0xC0, 13)]


def test_census_counts_opcodes_and_pipes_inside_a_range():
    ins = census.parse_sass(SASS)
    counts = census.census(ins, 0x20, 0x80)
    assert counts == {"IMAD": 1, "LOP3": 1, "F2FP": 1, "HMUL2": 1, "HGMMA": 1, "ISETP": 1, "BRA": 1}
    pipes = census.by_pipe(counts)
    assert pipes["alu"] == 3 and pipes["fma"] == 2 and pipes["tensor"] == 1 and pipes["control"] == 1
    assert sum(pipes.values()) == sum(counts.values())


@pytest.mark.parametrize("opcode, pipe", [
    ("LOP3.LUT", "alu"), ("F2FP.F16.E4M3.UNPACK_B", "alu"), ("PRMT", "alu"), ("FSEL", "alu"),
    ("IMAD.WIDE.U32", "fma"), ("FADD.FTZ", "fma"), ("HMUL2", "fma"),
    ("HGMMA.64x64x16.F32", "tensor"), ("LDS.128", "memory"), ("ATOMS.POPC.INC.32", "memory"),
    ("BAR.SYNC.DEFER_BLOCKING", "control"), ("UIADD3", "uniform"), ("R2UR", "uniform"),
    ("S2R", "other"), ("XYZZY", "other"),
])
def test_each_opcode_has_its_pipe(opcode, pipe):
    assert census.pipe_of(opcode) == pipe


def test_an_unknown_kernel_is_named_in_the_error():
    with pytest.raises(ValueError, match="kernel: 'no_such_kernel<1>'"):
        census.source_of("no_such_kernel<1>")
    assert census.source_of("score_wgmma_kernel<128>") == "score_wgmma.cu"


def test_the_named_function_is_taken_from_a_listing_of_several():
    two = SASS + SASS.replace("_Z6kernelv", "_Z5otherv").replace("LOP3.LUT", "PRMT")
    mine = census.parse_sass(census.function_sass(two, "kernel"))
    theirs = census.parse_sass(census.function_sass(two, "other"))
    assert len(mine) == len(theirs) == 14
    assert "LOP3.LUT" in [op for _, op, _ in mine] and "PRMT" in [op for _, op, _ in theirs]
    assert census.function_sass(SASS, "absent") == SASS


def test_the_tile_loop_is_the_smallest_with_an_mma_not_a_warpgroup_wait():
    # a loop of its own around a warpgroup wait (an out-of-line path) is not the tile loop
    extra = SASS.replace("        /*00d0*/                   EXIT ;",
                         "        /*00d0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
                         "        /*00e0*/                   BRA 0xd0 ;\n"
                         "        /*00f0*/                   EXIT ;")
    ins = census.parse_sass(extra)
    found = census.loops(ins)
    assert found[-1] == (0xD0, 0xE0, 2)  # the smallest loop: the wait's
    assert found[census.tile_loop(ins, found)] == (0x20, 0x80, 7)
    assert census.tile_loop(ins, [(0xD0, 0xE0, 2)]) == 0  # no MMA anywhere: the first (largest)


def test_a_loop_is_listed_whole_or_by_pipe():
    ins = census.parse_sass(SASS)
    whole = census.listing(ins, 0x20, 0x80)
    assert len(whole) == 7 and whole[0].startswith("0x0020  IMAD.SHL.U32") and whole[-1] == "0x0080  @!P0 BRA 0x20"
    alu = census.listing(ins, 0x20, 0x80, "alu")
    assert [line.split()[1] for line in alu] == ["LOP3.LUT", "F2FP.F16.E4M3.UNPACK_B", "ISETP.GE.AND"]



RES_USAGE = """
Resource usage:
 Common:
  GLOBAL:52 CONSTANT[4]:104
 Function _Z20topk_filter_kernel_xILi256EEvPKf:
  REG:24 STACK:0 SHARED:1032 LOCAL:0 CONSTANT[0]:400 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z18topk_filter_kernelILi256ELi16ELb0EEvPKfxPKiiPKjiPjPyi:
  REG:40 STACK:8 SHARED:1164 LOCAL:0 CONSTANT[0]:596 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_resource_usage_is_the_named_functions_not_a_longer_names():
    use = census.parse_resource_usage(RES_USAGE, "topk_filter_kernel")
    assert use["REG"] == 40 and use["SHARED"] == 1164 and use["STACK"] == 8 and use["CONSTANT[0]"] == 596
    assert census.parse_resource_usage(RES_USAGE, "topk_filter_kernel_x")["REG"] == 24
    with pytest.raises(ValueError, match="topk_rank_kernel"):
        census.parse_resource_usage(RES_USAGE, "topk_rank_kernel")
