/*
 * CPU feature detection. x86: cpuid for the instruction sets, xgetbv for the OS saving
 * the wider register state (YMM for AVX2, ZMM + opmask for AVX-512). aarch64: the
 * kernel's hardware capabilities, getauxval(AT_HWCAP) (FP and ASIMD: the kernel
 * reports what it saves and lets user space run). AMX: cpuid, xgetbv and on Linux the
 * tile-data permission (arch_prctl through syscall(2), declared with _DEFAULT_SOURCE).
 */
#define _DEFAULT_SOURCE
#include "core.h"

#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long xgetbv0(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static int os_avx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 27))) return 0; /* OSXSAVE */
    return (xgetbv0() & 0x6) == 0x6; /* XMM + YMM */
}

int lk_cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!os_avx()) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int fma = (c >> 12) & 1, f16c = (c >> 29) & 1, avx = (c >> 28) & 1;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int avx2 = (b >> 5) & 1;
    return fma && f16c && avx && avx2;
}

static int hw_avx512(void) {
    unsigned a, b, c, d;
    if (!lk_cpu_has_avx2()) return 0;
    if ((xgetbv0() & 0xe6) != 0xe6) return 0; /* opmask + ZMM hi256 + hi16 ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    return f && dq && bw && vl;
}

/* the avx512bf16 row: AVX512_BF16 (dot products) and AVX512_VBMI (byte lookups of the
 * fp8 widening); Zen 4 / 5, Sapphire Rapids and later have both, Cooper Lake (BF16
 * without VBMI) runs the avx512 row */
static int hw_avx512bf16(void) {
    unsigned a, b, c, d;
    if (!hw_avx512()) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((c >> 1) & 1)) return 0; /* AVX512_VBMI */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;
}

/* the amx row: avx512bf16 plus AMX-TILE and AMX-BF16 (Sapphire Rapids and later), the
 * OS saving the tile state (XCR0 XTILECFG + XTILEDATA), and on Linux the process's
 * permission to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once here when
 * not yet granted: a grant only, as oneDNN and PyTorch ask for it; it cannot be taken
 * back and changes nothing else the program sees) */
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define LK_ARCH_GET_XCOMP_PERM 0x1022
#define LK_ARCH_REQ_XCOMP_PERM 0x1023
#define LK_XFEATURE_XTILEDATA 18
static int os_amx_permitted(void) {
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, LK_ARCH_GET_XCOMP_PERM, &mask) == 0 && (mask >> LK_XFEATURE_XTILEDATA) & 1) return 1;
    if (syscall(SYS_arch_prctl, LK_ARCH_REQ_XCOMP_PERM, LK_XFEATURE_XTILEDATA) != 0) return 0;
    mask = 0;
    return syscall(SYS_arch_prctl, LK_ARCH_GET_XCOMP_PERM, &mask) == 0 && (mask >> LK_XFEATURE_XTILEDATA) & 1;
}
#else
static int os_amx_permitted(void) { return 0; } /* no tile permission to ask for: not used */
#endif
static int hw_amx(void) {
    unsigned a, b, c, d;
    if (!hw_avx512bf16()) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 24) & 1) || !((d >> 22) & 1)) return 0; /* AMX-TILE, AMX-BF16 */
    if ((xgetbv0() & 0x60000) != 0x60000) return 0;     /* XTILECFG + XTILEDATA */
    return os_amx_permitted();
}

#if defined(LLMKERN_EMULATE_AVX512)
/* test builds (cmake -DLLMKERN_EMULATE_AVX512=ON): the avx512 and avx512bf16 rows are
 * compiled for AVX2 with AVX-512 emulated (src/cpu/vec/x86_emu.h), so they run wherever
 * AVX2 does; the amx row is not emulated and never runs */
int lk_cpu_has_avx512(void) { return lk_cpu_has_avx2(); }
int lk_cpu_has_avx512bf16(void) { return lk_cpu_has_avx2(); }
int lk_cpu_has_amx(void) { return (void)hw_amx, 0; } /* hw_amx and the two above: unused here */
#else
int lk_cpu_has_avx512(void) { return hw_avx512(); }
int lk_cpu_has_avx512bf16(void) { return hw_avx512bf16(); }
int lk_cpu_has_amx(void) { return hw_amx(); }
#endif

/* GenuineIntel: its cores run VDPBF16PS at about one per two cycles against two f32 FMAs
 * a cycle (Emerald Rapids, measured: 32 products per 2.2 cycles against 32 per cycle),
 * so bf16 dot products pay only where the CPU is not one of them */
static int intel(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu; /* "Genu" "ineI" "ntel" */
}
#else
static int intel(void) { return 0; }
int lk_cpu_has_avx2(void) { return 0; }
int lk_cpu_has_avx512(void) { return 0; }
int lk_cpu_has_avx512bf16(void) { return 0; }
int lk_cpu_has_amx(void) { return 0; }
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_FP
#define HWCAP_FP (1ul << 0)
#endif
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1ul << 1)
#endif

int lk_cpu_has_neon(void) {
    unsigned long hw = getauxval(AT_HWCAP);
    return (hw & HWCAP_FP) && (hw & HWCAP_ASIMD);
}
#elif defined(__aarch64__)
int lk_cpu_has_neon(void) { return 1; } /* Advanced SIMD is part of every aarch64 CPU */
#else
int lk_cpu_has_neon(void) { return 0; }
#endif

/* whether the kernels that can take f32 FMAs or bf16 dot products take the FMAs:
 * -1 = the CPU's (intel(), asked once: cpuid exits to the hypervisor in a VM), 0 / 1
 * forced (lk_cpu_set_prefer_fma, tests) */
static _Atomic int prefer_fma = -1, cpu_fma = -1;
int lk_cpu_prefer_fma(void) {
    int p = atomic_load(&prefer_fma);
    if (p >= 0) return p;
    int c = atomic_load(&cpu_fma);
    if (c < 0) atomic_store(&cpu_fma, c = intel());
    return c;
}
void lk_cpu_set_prefer_fma(int p) { atomic_store(&prefer_fma, p < 0 ? -1 : p != 0); }
