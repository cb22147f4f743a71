/* C99 complex functions for Wine 8.0's ucrtbase, which only stubs them: MSVC passes _Fcomplex/_Dcomplex
   as structs of two floats/doubles (and _Lcomplex as doubles: MSVC's long double is double). */
#include <complex.h>
typedef struct { float v[2]; } Fc;
typedef struct { double v[2]; } Dc;
static inline float complex F(Fc z) { return __builtin_complex(z.v[0], z.v[1]); }
static inline double complex D(Dc z) { return __builtin_complex(z.v[0], z.v[1]); }
static inline Fc toF(float complex z) { Fc r = {{crealf(z), cimagf(z)}}; return r; }
static inline Dc toD(double complex z) { Dc r = {{creal(z), cimag(z)}}; return r; }
Fc shim__FCbuild(float re, float im) { Fc r = {{re, im}}; return r; }
float shim_crealf(Fc z) { return z.v[0]; }
double shim_creall(Dc z) { return z.v[0]; }
double shim_cimag(Dc z) { return z.v[1]; }
float shim_cimagf(Fc z) { return z.v[1]; }
double shim_cimagl(Dc z) { return z.v[1]; }
float shim_cabsf(Fc z) { return cabsf(F(z)); }
double shim_cabsl(Dc z) { return cabs(D(z)); }
double shim_carg(Dc z) { return carg(D(z)); }
float shim_cargf(Fc z) { return cargf(F(z)); }
double shim_cargl(Dc z) { return carg(D(z)); }
#define UNARY(N) Dc shim_##N(Dc z) { return toD(N(D(z))); } Fc shim_##N##f(Fc z) { return toF(N##f(F(z))); } \
                 Dc shim_##N##l(Dc z) { return toD(N(D(z))); }
UNARY(ccos) UNARY(ccosh) UNARY(cexp) UNARY(csin) UNARY(csinh) UNARY(ctan) UNARY(ctanh)
Dc shim_cpow(Dc a, Dc b) { return toD(cpow(D(a), D(b))); }
Fc shim_cpowf(Fc a, Fc b) { return toF(cpowf(F(a), F(b))); }
Dc shim_cpowl(Dc a, Dc b) { return toD(cpow(D(a), D(b))); }
