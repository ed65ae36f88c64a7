// Element casts: CheckCast and CastElements (declared in engine/copy.h).
//
// float16 and bfloat16 are converted by hand with integer bit operations so
// the result does not depend on compiler support for _Float16 / __bf16 or on
// F16C, and so the common loops stay simple enough to auto-vectorize. Every
// load and store goes through memcpy: buffers come from storage reads at any
// byte offset.

#include <cstring>
#include <string>
#include <type_traits>

#include "engine/copy.h"

namespace shardkeep::internal {
namespace {

// Storage types for the 16-bit floats: raw IEEE / bfloat16 bit patterns.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint64_t BitsOf(double f) {
  uint64_t u;
  std::memcpy(&u, &f, 8);
  return u;
}

// Rounds a binary floating-point number given by its bits (kSrcExp exponent
// bits, kSrcMant mantissa bits, in UInt) to a narrower format (kDstExp,
// kDstMant), to nearest even in one step. NaN becomes a quiet NaN keeping the
// sign and the top payload bits; values too large for the destination become
// infinity; values in its subnormal range round to a subnormal or zero.
template <typename UInt, int kSrcExp, int kSrcMant, int kDstExp, int kDstMant>
uint16_t RoundToNarrow(UInt u) {
  static_assert(kDstExp <= kSrcExp && kDstMant < kSrcMant);
  constexpr int kSrcBias = (1 << (kSrcExp - 1)) - 1;
  constexpr int kDstBias = (1 << (kDstExp - 1)) - 1;
  constexpr int kDstMaxExp = (1 << kDstExp) - 1;  // inf / NaN exponent
  constexpr int kShift = kSrcMant - kDstMant;     // mantissa bits dropped
  constexpr UInt kOne = 1;
  constexpr UInt kMantMask = (kOne << kSrcMant) - 1;
  constexpr uint16_t kDstInf = uint16_t(kDstMaxExp << kDstMant);

  const uint16_t sign =
      uint16_t((u >> (kSrcExp + kSrcMant)) << (kDstExp + kDstMant));
  const UInt abs = u & ((kOne << (kSrcExp + kSrcMant)) - 1);
  const int exp = int(abs >> kSrcMant);
  const UInt mant = abs & kMantMask;

  if (exp == (1 << kSrcExp) - 1) {  // infinity or NaN
    if (mant == 0) return sign | kDstInf;
    return sign | kDstInf | uint16_t(1 << (kDstMant - 1)) |
           uint16_t(mant >> kShift);
  }
  // Exponent re-biased for the destination (subnormal sources count as
  // exponent 1 without the implicit bit).
  const int dst_exp = (exp == 0 ? 1 : exp) - kSrcBias + kDstBias;
  if (dst_exp >= kDstMaxExp) return sign | kDstInf;

  UInt bits;  // destination magnitude before rounding, with `shift` extra bits
  int shift;
  if (exp != 0 && dst_exp >= 1) {
    // Normal result: re-bias in place; rounding up may carry into the
    // exponent, and from the largest finite value gives exactly infinity.
    bits = abs - (UInt(kSrcBias - kDstBias) << kSrcMant);
    shift = kShift;
  } else {
    // Subnormal result (or zero): the significand shifted right so its unit
    // is the destination's smallest subnormal. Shifts beyond kSrcMant + 2
    // round to zero like kSrcMant + 2 does, and keep the shift in range.
    bits = mant | (exp != 0 ? kOne << kSrcMant : 0);
    shift = kShift + 1 - dst_exp;
    if (shift > kSrcMant + 2) shift = kSrcMant + 2;
  }
  const UInt half_minus_one = (kOne << (shift - 1)) - 1;
  const UInt odd = (bits >> shift) & 1;
  return sign | uint16_t((bits + half_minus_one + odd) >> shift);
}

// float32 -> bfloat16 keeps the exponent, so rounding is one add on the bits;
// written branch-free so the loop vectorizes.
uint16_t FloatToBFloat16(float f) {
  const uint32_t u = BitsOf(f);
  const uint32_t rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40;
  const bool is_nan = (u & 0x7FFFFFFF) > 0x7F800000;
  return uint16_t(is_nan ? quiet_nan : rounded);
}

float BFloat16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  const bool is_nan = (u & 0x7FFFFFFF) > 0x7F800000;
  return FloatOf(is_nan ? u | 0x400000 : u);  // quiet a signaling NaN
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  uint32_t out;
  if (exp == 0x1F) {  // infinity or NaN (quieted)
    out = 0x7F800000 | (mant << 13) | (mant != 0 ? 0x400000 : 0);
  } else if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    out = BitsOf(float(mant) * 0x1p-24f);
  } else {
    out = ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return FloatOf(sign | out);
}

uint16_t FloatToHalf(float f) {
  return RoundToNarrow<uint32_t, 8, 23, 5, 10>(BitsOf(f));
}
uint16_t DoubleToHalf(double f) {
  return RoundToNarrow<uint64_t, 11, 52, 5, 10>(BitsOf(f));
}
uint16_t DoubleToBFloat16(double f) {
  return RoundToNarrow<uint64_t, 11, 52, 8, 7>(BitsOf(f));
}

template <typename T>
constexpr bool kIsWideFloat =
    std::is_same_v<T, float> || std::is_same_v<T, double>;

// One element. Integers convert with static_cast, which wraps modulo 2^n as
// numpy's astype does. Conversions from the 16-bit floats widen through
// float (exact); conversions to them round once from float or double.
template <typename To, typename From>
To Convert(From v) {
  if constexpr (std::is_integral_v<From> ||
                (kIsWideFloat<From> && kIsWideFloat<To>)) {
    return static_cast<To>(v);
  } else if constexpr (std::is_same_v<From, Half>) {
    return Convert<To>(HalfToFloat(v.bits));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return Convert<To>(BFloat16ToFloat(v.bits));
  } else if constexpr (std::is_same_v<To, Half>) {
    if constexpr (std::is_same_v<From, float>) return Half{FloatToHalf(v)};
    else return Half{DoubleToHalf(v)};
  } else {
    static_assert(std::is_same_v<To, BFloat16>);
    if constexpr (std::is_same_v<From, float>) {
      return BFloat16{FloatToBFloat16(v)};
    } else {
      return BFloat16{DoubleToBFloat16(v)};
    }
  }
}

template <typename From, typename To>
void CastLoop(const uint8_t* src, uint8_t* dst, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) {
    From v;
    std::memcpy(&v, src + i * sizeof(From), sizeof(From));
    const To out = Convert<To>(v);
    std::memcpy(dst + i * sizeof(To), &out, sizeof(To));
  }
}

// Calls fn(T{}) with the C++ type standing for `dtype` (nothing for a dtype
// outside the family).
template <typename Fn>
void VisitFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat16{});
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    default: return;
  }
}

template <typename Fn>
void VisitInteger(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kInt8: return fn(int8_t{});
    case DType::kInt16: return fn(int16_t{});
    case DType::kInt32: return fn(int32_t{});
    case DType::kInt64: return fn(int64_t{});
    case DType::kUInt8: return fn(uint8_t{});
    case DType::kUInt16: return fn(uint16_t{});
    case DType::kUInt32: return fn(uint32_t{});
    case DType::kUInt64: return fn(uint64_t{});
    default: return;
  }
}

bool IsSigned(DType d) {
  return d == DType::kInt8 || d == DType::kInt16 || d == DType::kInt32 ||
         d == DType::kInt64;
}

// True when every value of `from` is exactly a value of `to`.
bool IsWidening(DType from, DType to) {
  if (IsCastableFloat(from)) {
    return DTypeSize(to) > DTypeSize(from);  // f16/bf16 -> f32/f64, f32 -> f64
  }
  // Integers: a wider type of the same signedness, or a wider signed type
  // for an unsigned one.
  return DTypeSize(to) > DTypeSize(from) && (IsSigned(to) || !IsSigned(from));
}

}  // namespace

Status CheckCast(DType from, DType to, bool allow_lossy) {
  if (from == to) return Status::Ok();
  const std::string names =
      std::string(DTypeName(from)) + " to " + std::string(DTypeName(to));
  const bool same_family = (IsCastableFloat(from) && IsCastableFloat(to)) ||
                           (IsInteger(from) && IsInteger(to));
  if (!same_family) {
    return IncompatibleError("cannot cast " + names + ": unsupported");
  }
  if (allow_lossy || IsWidening(from, to)) return Status::Ok();
  return IncompatibleError("cannot cast " + names +
                           " without allow_lossy_cast (it may lose precision)");
}

void CastElements(const uint8_t* src, DType from, uint8_t* dst, DType to,
                  uint64_t count) {
  if (from == to) {
    if (count != 0) std::memcpy(dst, src, count * DTypeSize(from));
    return;
  }
  if (IsCastableFloat(from)) {
    VisitFloat(from, [&](auto f) {
      VisitFloat(to, [&](auto t) {
        CastLoop<decltype(f), decltype(t)>(src, dst, count);
      });
    });
  } else {
    VisitInteger(from, [&](auto f) {
      VisitInteger(to, [&](auto t) {
        CastLoop<decltype(f), decltype(t)>(src, dst, count);
      });
    });
  }
}

}  // namespace shardkeep::internal
