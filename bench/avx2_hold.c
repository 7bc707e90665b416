// Answers cpuid and xgetbv as a CPU without AVX-512 would, for bench/avx2.py.
//
// bench/avx2.py copies the binaries of a comparison (onnxruntime's, pipetrain's, oneDNN's) and
// writes each of their cpuid instructions as int3; nop and each xgetbv as int3; xchg ax,ax. With
// this library preloaded, the trap lands here: the handler runs the real instruction and clears
// the AVX-512 bits (leaf 7's AVX512* flags, AVX-VNNI and AVX512_BF16, and XCR0's opmask and
// upper-ZMM state), so each program's own dispatch picks the path it takes on an AVX2 CPU.
//
// The handler is installed from an ifunc resolver, which ld.so runs while it relocates this
// library: before the main program's own resolvers (GCC's target_clones) ask for the CPU. So
// this file uses no libc: it is linked with -nostdlib and makes its one system call itself.
#define _GNU_SOURCE
#include <asm/unistd.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <ucontext.h>

static const unsigned kLeaf7Ebx = (1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) |
                                  (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31);
static const unsigned kLeaf7Ecx = (1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14);
static const unsigned kLeaf7Edx = (1u << 2) | (1u << 3) | (1u << 8) | (1u << 23);
static const unsigned kLeaf7Sub1Eax = (1u << 4) | (1u << 5);
static const unsigned kXcr0Avx512 = 0xE0u;  // opmask, ZMM_Hi256, Hi16_ZMM

static void answer(int sig, siginfo_t* info, void* context) {
  (void)sig;
  (void)info;
  greg_t* r = ((ucontext_t*)context)->uc_mcontext.gregs;
  const uint8_t* at = (const uint8_t*)r[REG_RIP];  // just past the int3
  unsigned a, b, c, d;
  if (at[-1] == 0xCC && at[0] == 0x90) {
    unsigned leaf = (unsigned)r[REG_RAX], sub = (unsigned)r[REG_RCX];
    __cpuid_count(leaf, sub, a, b, c, d);
    if (leaf == 7 && sub == 0) {
      b &= ~kLeaf7Ebx;
      c &= ~kLeaf7Ecx;
      d &= ~kLeaf7Edx;
    } else if (leaf == 7 && sub == 1) {
      a &= ~kLeaf7Sub1Eax;
    } else if (leaf == 0xD && sub == 0) {
      a &= ~kXcr0Avx512;
    }
    r[REG_RAX] = a;
    r[REG_RBX] = b;
    r[REG_RCX] = c;
    r[REG_RDX] = d;
    r[REG_RIP] += 1;
  } else if (at[-1] == 0xCC && at[0] == 0x66 && at[1] == 0x90) {
    unsigned index = (unsigned)r[REG_RCX];
    __asm__ volatile("xgetbv" : "=a"(a), "=d"(d) : "c"(index));
    if (index == 0) a &= ~kXcr0Avx512;
    r[REG_RAX] = a;
    r[REG_RDX] = d;
    r[REG_RIP] += 2;
  } else {
    __builtin_trap();  // an int3 this file did not write: not ours to answer
  }
}

void avx2_hold_restore(void);
__asm__(".text\n.type avx2_hold_restore,@function\navx2_hold_restore:\n"
        "  mov $15, %eax\n  syscall\n");  // rt_sigreturn

struct kernel_sigaction {
  void* handler;
  unsigned long flags;
  void (*restorer)(void);
  unsigned long mask;
};

static void installed(void) {}

typedef void (*function)(void);

static function install(void) {
  struct kernel_sigaction sa = {(void*)answer, 0x4 /* SA_SIGINFO */ | 0x04000000 /* SA_RESTORER */,
                                avx2_hold_restore, 0};
  register long mask_size __asm__("r10") = sizeof sa.mask;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"((long)__NR_rt_sigaction), "D"((long)SIGTRAP), "S"(&sa), "d"(0L),
                     "r"(mask_size)
                   : "rcx", "r11", "memory");
  return installed;
}

static void hold(void) __attribute__((ifunc("install")));
void (*volatile avx2_hold_installed)(void) = hold;  // the relocation that runs install()
