#include "engine/copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "testing/status_matchers.h"

namespace shardkeep::internal {
namespace {

constexpr DType kFloats[] = {DType::kFloat16, DType::kBFloat16,
                             DType::kFloat32, DType::kFloat64};
constexpr DType kIntegers[] = {DType::kInt8,   DType::kInt16,  DType::kInt32,
                               DType::kInt64,  DType::kUInt8,  DType::kUInt16,
                               DType::kUInt32, DType::kUInt64};

std::vector<DType> AllDTypes() {
  std::vector<DType> out;
  for (int i = 0; i <= static_cast<int>(DType::kFloat4E2M1FN); ++i) {
    out.push_back(static_cast<DType>(i));
  }
  return out;
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> Values(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<uint8_t> Cast(const std::vector<uint8_t>& src, DType from,
                          DType to) {
  const uint64_t count = src.size() / DTypeSize(from);
  std::vector<uint8_t> dst(count * DTypeSize(to));
  CastElements(src.data(), from, dst.data(), to, count);
  return dst;
}

template <typename From, typename To>
std::vector<To> CastValues(const std::vector<From>& v, DType from, DType to) {
  return Values<To>(Cast(Bytes(v), from, to));
}

// ---------------------------------------------------------------------------
// Reference 16-bit float arithmetic, written with ldexp and a search over the
// ordered bit patterns rather than with bit tricks, so it shares no code or
// method with cast.cc.

struct Format16 {
  int mant_bits;
  int bias;
  uint16_t max_finite;  // bit pattern; max_finite + 1 is infinity
};
constexpr Format16 kHalfFormat = {10, 15, 0x7BFF};
constexpr Format16 kBFloat16Format = {7, 127, 0x7F7F};

const Format16& FormatOf(DType dtype) {
  return dtype == DType::kFloat16 ? kHalfFormat : kBFloat16Format;
}

bool RefIsNaN16(DType dtype, uint16_t bits) {
  return (bits & 0x7FFF) > FormatOf(dtype).max_finite + 1;
}

// Value of a 16-bit pattern that is not NaN.
double RefDecode16(DType dtype, uint16_t bits) {
  const Format16& f = FormatOf(dtype);
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int abs = bits & 0x7FFF;
  if (abs == f.max_finite + 1) return sign * INFINITY;
  const int exp = abs >> f.mant_bits;
  const int mant = abs & ((1 << f.mant_bits) - 1);
  if (exp == 0) return sign * std::ldexp(mant, 1 - f.bias - f.mant_bits);
  return sign * std::ldexp(mant + (1 << f.mant_bits),
                           exp - f.bias - f.mant_bits);
}

// Nearest 16-bit value to non-NaN `x`, ties to the even pattern; beyond the
// largest finite value by half an ulp or more gives infinity (IEEE rules).
uint16_t RefRound16(DType dtype, double x) {
  const Format16& f = FormatOf(dtype);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const long double a = std::fabs(x);
  // First pattern whose value exceeds a; positive patterns sort by value.
  int lo = 0, hi = f.max_finite + 1;  // invariant: value(lo) <= a < value(hi)
  if (a >= RefDecode16(dtype, f.max_finite)) {
    lo = f.max_finite;
  } else {
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (RefDecode16(dtype, mid) <= a ? lo : hi) = mid;
    }
  }
  const long double lo_value = RefDecode16(dtype, lo);
  long double hi_value;
  if (lo == f.max_finite) {  // the value one ulp past the largest finite one
    hi_value = 2 * lo_value - RefDecode16(dtype, lo - 1);
  } else {
    hi_value = RefDecode16(dtype, lo + 1);
  }
  if (a == lo_value) return sign | lo;
  if (std::isinf(x)) return sign | (f.max_finite + 1);
  const long double below = a - lo_value, above = hi_value - a;
  const bool up = above < below || (above == below && (lo & 1));
  return sign | (up ? lo + 1 : lo);
}

// The value of element `i` of a float-family buffer, as a double (exact).
double DecodeFloat(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return RefIsNaN16(dtype, b) ? NAN : RefDecode16(dtype, b);
    }
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
  }
}

bool IsNaNAt(DType dtype, const uint8_t* p) {
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return RefIsNaN16(dtype, b);
  }
  return std::isnan(DecodeFloat(dtype, p));
}

bool SignBitAt(DType dtype, const uint8_t* p) {
  return (p[DTypeSize(dtype) - 1] & 0x80) != 0;
}

// The expected bytes of `x` (not NaN) cast to `to`.
std::vector<uint8_t> RefEncodeFloat(DType to, double x) {
  std::vector<uint8_t> out(DTypeSize(to));
  if (to == DType::kFloat16 || to == DType::kBFloat16) {
    const uint16_t b = RefRound16(to, x);
    std::memcpy(out.data(), &b, 2);
  } else if (to == DType::kFloat32) {
    const float f = static_cast<float>(x);  // the hardware rounds to nearest
    std::memcpy(out.data(), &f, 4);
  } else {
    std::memcpy(out.data(), &x, 8);
  }
  return out;
}

// Random test inputs for a float dtype: random bit patterns, values spread
// over the 16-bit formats' ranges (subnormals to overflow), and exact ties
// between neighbouring 16-bit values with their source neighbours.
std::vector<uint8_t> FloatInputs(DType dtype, std::mt19937_64& rng, int n) {
  std::vector<double> values;
  std::vector<uint8_t> raw;
  const size_t size = DTypeSize(dtype);
  for (int i = 0; i < n; ++i) {
    const uint64_t bits = rng();
    raw.insert(raw.end(), reinterpret_cast<const uint8_t*>(&bits),
               reinterpret_cast<const uint8_t*>(&bits) + size);
  }
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) return raw;
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  for (int i = 0; i < n; ++i) {
    const int exp = (i % 2) ? int(rng() % 60) - 30 : int(rng() % 270) - 140;
    const double sign = (rng() & 1) ? -1.0 : 1.0;
    values.push_back(sign * std::ldexp(mantissa(rng), exp));
  }
  for (DType narrow : {DType::kFloat16, DType::kBFloat16}) {
    for (int i = 0; i < n; ++i) {
      const uint16_t lo = rng() % FormatOf(narrow).max_finite;
      const double tie =
          (RefDecode16(narrow, lo) + RefDecode16(narrow, lo + 1)) / 2;
      values.push_back(tie);
      values.push_back(-tie);
      const double inf = INFINITY;
      if (dtype == DType::kFloat32) {
        values.push_back(std::nextafter(float(tie), float(inf)));
        values.push_back(std::nextafter(float(tie), -float(inf)));
      } else {
        values.push_back(std::nextafter(tie, inf));
        values.push_back(std::nextafter(tie, -inf));
      }
    }
  }
  for (double v : values) {
    if (dtype == DType::kFloat32) {
      const float f = static_cast<float>(v);
      raw.insert(raw.end(), reinterpret_cast<const uint8_t*>(&f),
                 reinterpret_cast<const uint8_t*>(&f) + 4);
    } else {
      raw.insert(raw.end(), reinterpret_cast<const uint8_t*>(&v),
                 reinterpret_cast<const uint8_t*>(&v) + 8);
    }
  }
  return raw;
}

// ---------------------------------------------------------------------------
// CheckCast

bool InList(DType from, DType to,
            std::initializer_list<std::pair<DType, DType>> list) {
  return std::find(list.begin(), list.end(), std::make_pair(from, to)) !=
         list.end();
}

bool IsWideningPair(DType from, DType to) {
  using D = DType;
  return InList(
      from, to,
      {{D::kFloat16, D::kFloat32},  {D::kFloat16, D::kFloat64},
       {D::kBFloat16, D::kFloat32}, {D::kBFloat16, D::kFloat64},
       {D::kFloat32, D::kFloat64},  {D::kInt8, D::kInt16},
       {D::kInt8, D::kInt32},       {D::kInt8, D::kInt64},
       {D::kInt16, D::kInt32},      {D::kInt16, D::kInt64},
       {D::kInt32, D::kInt64},      {D::kUInt8, D::kUInt16},
       {D::kUInt8, D::kUInt32},     {D::kUInt8, D::kUInt64},
       {D::kUInt8, D::kInt16},      {D::kUInt8, D::kInt32},
       {D::kUInt8, D::kInt64},      {D::kUInt16, D::kUInt32},
       {D::kUInt16, D::kUInt64},    {D::kUInt16, D::kInt32},
       {D::kUInt16, D::kInt64},     {D::kUInt32, D::kUInt64},
       {D::kUInt32, D::kInt64}});
}

bool SameFamily(DType a, DType b) {
  const auto in = [](DType d, const auto& list) {
    return std::find(std::begin(list), std::end(list), d) != std::end(list);
  };
  return (in(a, kFloats) && in(b, kFloats)) ||
         (in(a, kIntegers) && in(b, kIntegers));
}

TEST(CheckCastTest, IdentityIsAlwaysOk) {
  for (DType d : AllDTypes()) {
    SK_EXPECT_OK(CheckCast(d, d, false));
    SK_EXPECT_OK(CheckCast(d, d, true));
  }
}

TEST(CheckCastTest, EveryPairFollowsTheRules) {
  int widening = 0;
  for (DType from : AllDTypes()) {
    for (DType to : AllDTypes()) {
      if (from == to) continue;
      SCOPED_TRACE(std::string(DTypeName(from)) + " -> " +
                   std::string(DTypeName(to)));
      const Status strict = CheckCast(from, to, false);
      const Status lossy = CheckCast(from, to, true);
      if (!SameFamily(from, to)) {
        EXPECT_EQ(strict.code(), StatusCode::kIncompatible);
        EXPECT_EQ(lossy.code(), StatusCode::kIncompatible);
        EXPECT_EQ(lossy.message(), "cannot cast " +
                                       std::string(DTypeName(from)) + " to " +
                                       std::string(DTypeName(to)) +
                                       ": unsupported");
      } else if (IsWideningPair(from, to)) {
        ++widening;
        SK_EXPECT_OK(strict);
        SK_EXPECT_OK(lossy);
      } else {
        EXPECT_EQ(strict.code(), StatusCode::kIncompatible);
        EXPECT_EQ(strict.message(),
                  "cannot cast " + std::string(DTypeName(from)) + " to " +
                      std::string(DTypeName(to)) +
                      " without allow_lossy_cast (it may lose precision)");
        SK_EXPECT_OK(lossy);
      }
    }
  }
  EXPECT_EQ(widening, 23);
}

TEST(CheckCastTest, Messages) {
  EXPECT_EQ(CheckCast(DType::kFloat32, DType::kBFloat16, false).message(),
            "cannot cast float32 to bfloat16 without allow_lossy_cast (it may "
            "lose precision)");
  EXPECT_EQ(CheckCast(DType::kFloat32, DType::kInt32, true).message(),
            "cannot cast float32 to int32: unsupported");
  EXPECT_EQ(CheckCast(DType::kBool, DType::kInt8, true).code(),
            StatusCode::kIncompatible);
  EXPECT_EQ(CheckCast(DType::kInt4, DType::kInt8, true).code(),
            StatusCode::kIncompatible);
  EXPECT_EQ(CheckCast(DType::kFloat8E4M3FN, DType::kFloat32, true).code(),
            StatusCode::kIncompatible);
  EXPECT_EQ(CheckCast(DType::kComplex64, DType::kComplex128, true).code(),
            StatusCode::kIncompatible);
  EXPECT_EQ(CheckCast(DType::kUInt64, DType::kInt64, false).code(),
            StatusCode::kIncompatible);
  EXPECT_EQ(CheckCast(DType::kFloat16, DType::kBFloat16, false).code(),
            StatusCode::kIncompatible);
}

// ---------------------------------------------------------------------------
// CastElements: integers

TEST(CastElementsTest, IntegerNarrowingWrapsLikeNumpy) {
  EXPECT_EQ((CastValues<int32_t, int8_t>({300, -1, 127, 128, -129, 256},
                                         DType::kInt32, DType::kInt8)),
            (std::vector<int8_t>{44, -1, 127, -128, 127, 0}));
  EXPECT_EQ((CastValues<int32_t, uint8_t>({-1, 300, 255}, DType::kInt32,
                                          DType::kUInt8)),
            (std::vector<uint8_t>{255, 44, 255}));
  EXPECT_EQ((CastValues<uint64_t, int64_t>(
                {~uint64_t{0}, uint64_t{1} << 63}, DType::kUInt64,
                DType::kInt64)),
            (std::vector<int64_t>{-1, std::numeric_limits<int64_t>::min()}));
  EXPECT_EQ((CastValues<int8_t, uint64_t>({-1, 5}, DType::kInt8,
                                          DType::kUInt64)),
            (std::vector<uint64_t>{~uint64_t{0}, 5}));
  EXPECT_EQ((CastValues<uint8_t, int16_t>({255, 0}, DType::kUInt8,
                                          DType::kInt16)),
            (std::vector<int16_t>{255, 0}));
  EXPECT_EQ((CastValues<int64_t, uint32_t>({-2, int64_t{1} << 40 | 7},
                                           DType::kInt64, DType::kUInt32)),
            (std::vector<uint32_t>{0xFFFFFFFE, 7}));
}

bool IsSignedInt(DType d) {
  return d == DType::kInt8 || d == DType::kInt16 || d == DType::kInt32 ||
         d == DType::kInt64;
}

TEST(CastElementsTest, AllIntegerPairsMatchModularReference) {
  std::mt19937_64 rng(7);
  for (DType from : kIntegers) {
    for (DType to : kIntegers) {
      SCOPED_TRACE(std::string(DTypeName(from)) + " -> " +
                   std::string(DTypeName(to)));
      const size_t in_size = DTypeSize(from), out_size = DTypeSize(to);
      std::vector<uint8_t> src(200 * in_size);
      for (auto& b : src) b = rng();
      // Make the extremes appear: 0, all ones, top bit only, top bit clear.
      std::memset(src.data(), 0, in_size);
      std::memset(src.data() + in_size, 0xFF, in_size);
      std::memset(src.data() + 2 * in_size, 0, in_size);
      src[3 * in_size - 1] = 0x80;
      std::memset(src.data() + 3 * in_size, 0xFF, in_size);
      src[4 * in_size - 1] = 0x7F;
      const std::vector<uint8_t> dst = Cast(src, from, to);
      for (size_t i = 0; i < 200; ++i) {
        // The mathematical value, then its residue modulo 2^(8*out_size).
        __int128 value = 0;
        for (size_t b = in_size; b-- > 0;) {
          value = value * 256 + src[i * in_size + b];
        }
        if (IsSignedInt(from) && (src[(i + 1) * in_size - 1] & 0x80)) {
          value -= static_cast<__int128>(1) << (8 * in_size);
        }
        for (size_t b = 0; b < out_size; ++b) {
          const int expected = static_cast<int>(
              (static_cast<unsigned __int128>(value) >> (8 * b)) & 0xFF);
          ASSERT_EQ(dst[i * out_size + b], expected) << "element " << i;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// CastElements: floats

std::vector<uint16_t> AllPatterns16() {
  std::vector<uint16_t> out(65536);
  for (int i = 0; i < 65536; ++i) out[i] = static_cast<uint16_t>(i);
  return out;
}

void CheckRoundTrip16(DType narrow, DType wide) {
  SCOPED_TRACE(std::string(DTypeName(narrow)) + " via " +
               std::string(DTypeName(wide)));
  const std::vector<uint16_t> in = AllPatterns16();
  const std::vector<uint8_t> widened = Cast(Bytes(in), narrow, wide);
  const std::vector<uint16_t> back =
      Values<uint16_t>(Cast(widened, wide, narrow));
  const size_t wsize = DTypeSize(wide);
  for (int i = 0; i < 65536; ++i) {
    const uint8_t* w = widened.data() + i * wsize;
    if (RefIsNaN16(narrow, in[i])) {
      ASSERT_TRUE(IsNaNAt(wide, w)) << std::hex << i;
      ASSERT_EQ(SignBitAt(wide, w), (i & 0x8000) != 0) << std::hex << i;
      ASSERT_TRUE(RefIsNaN16(narrow, back[i])) << std::hex << i;
      ASSERT_EQ(back[i] & 0x8000, i & 0x8000) << std::hex << i;
    } else {
      // Widening is exact (the reference decodes with ldexp); -0 stays -0.
      const double value = RefDecode16(narrow, in[i]);
      ASSERT_EQ(DecodeFloat(wide, w), value) << std::hex << i;
      ASSERT_EQ(SignBitAt(wide, w), (i & 0x8000) != 0) << std::hex << i;
      ASSERT_EQ(back[i], in[i]) << std::hex << i;
    }
  }
}

TEST(CastElementsTest, HalfRoundTripsAllBitPatterns) {
  CheckRoundTrip16(DType::kFloat16, DType::kFloat32);
  CheckRoundTrip16(DType::kFloat16, DType::kFloat64);
}

TEST(CastElementsTest, BFloat16RoundTripsAllBitPatterns) {
  CheckRoundTrip16(DType::kBFloat16, DType::kFloat32);
  CheckRoundTrip16(DType::kBFloat16, DType::kFloat64);
}

TEST(CastElementsTest, NaNsBecomeQuietNaNs) {
  // Signaling NaNs with a low payload bit, both signs.
  const std::vector<float> f32 = Values<float>(
      Bytes(std::vector<uint32_t>{0x7F800001, 0xFF800001, 0x7FC00000}));
  EXPECT_EQ((CastValues<float, uint16_t>(f32, DType::kFloat32,
                                         DType::kBFloat16)),
            (std::vector<uint16_t>{0x7FC0, 0xFFC0, 0x7FC0}));
  EXPECT_EQ((CastValues<float, uint16_t>(f32, DType::kFloat32,
                                         DType::kFloat16)),
            (std::vector<uint16_t>{0x7E00, 0xFE00, 0x7E00}));
  EXPECT_EQ((CastValues<uint16_t, uint32_t>({0x7C01, 0xFD00}, DType::kFloat16,
                                            DType::kFloat32)),
            (std::vector<uint32_t>{0x7FC02000, 0xFFE00000}));
  EXPECT_EQ((CastValues<uint16_t, uint32_t>({0x7F81, 0xFFC1},
                                            DType::kBFloat16,
                                            DType::kFloat32)),
            (std::vector<uint32_t>{0x7FC10000, 0xFFC10000}));
  EXPECT_EQ((CastValues<uint16_t, uint16_t>({0x7C01, 0x7F81},
                                            DType::kFloat16,
                                            DType::kBFloat16)),
            (std::vector<uint16_t>{0x7FC0, 0x7FF0}));
}

TEST(CastElementsTest, Float32ToBFloat16Rounding) {
  const std::vector<uint32_t> in = {
      0x3F808000,  // 1 + 2^-8: tie, rounds to even 1.0
      0x3F818000,  // 1 + 3*2^-8: tie, rounds to even 1 + 2^-6
      0x3F808001,  // just above the tie: up
      0x3F807FFF,  // just below the tie: down
      0x7F7F7FFF,  // below max + half ulp: max
      0x7F7F8000,  // max + half ulp (tie, max is odd): infinity
      0x7F7FFFFF,  // FLT_MAX: infinity
      0x00008000,  // subnormal tie: even (0)
      0x00018000,  // subnormal tie: even (2)
      0x807FFFFF,  // largest negative subnormal: rounds to -smallest normal
      0x80000000,  // -0
      0xFF800000,  // -inf
  };
  EXPECT_EQ((CastValues<uint32_t, uint16_t>(in, DType::kFloat32,
                                            DType::kBFloat16)),
            (std::vector<uint16_t>{0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x7F7F,
                                   0x7F80, 0x7F80, 0x0000, 0x0002, 0x8080,
                                   0x8000, 0xFF80}));
}

TEST(CastElementsTest, Float32ToHalfRounding) {
  const std::vector<float> in = {
      1.0f + 0x1p-11f,      // tie: even 1.0
      1.0f + 3 * 0x1p-11f,  // tie: even 1 + 2^-9
      65504.0f,             // max
      65519.0f,             // below max + half ulp: max
      65520.0f,             // max + half ulp: infinity
      1e10f,                // overflow
      0x1p-24f,             // smallest subnormal
      0x1p-25f,             // half of it: tie, even 0
      0x1.8p-24f,           // 1.5 units: tie, even 2 units
      0x1.000002p-25f,      // just above half a unit: 1 unit
      0x1p-14f - 0x1p-25f,  // tie between largest subnormal and min normal
      -0.0f,
      1e-30f,               // far below: +0
      -1e-30f,              // far below: -0
      std::numeric_limits<float>::denorm_min(),
  };
  EXPECT_EQ((CastValues<float, uint16_t>(in, DType::kFloat32,
                                         DType::kFloat16)),
            (std::vector<uint16_t>{0x3C00, 0x3C02, 0x7BFF, 0x7BFF, 0x7C00,
                                   0x7C00, 0x0001, 0x0000, 0x0002, 0x0001,
                                   0x0400, 0x8000, 0x0000, 0x8000, 0x0000}));
}

TEST(CastElementsTest, Float64ToHalfRoundsOnce) {
  // Just above a float16 tie; rounding to float32 first would land exactly
  // on the tie and then round to even (down): double rounding.
  const std::vector<double> in = {1.0 + 0x1p-11 + 0x1p-40,
                                  0x1p-25 + 0x1p-60,  // just above half a unit
                                  65520.0 - 0x1p-30,  // just below overflow
                                  1.0 + 0x1p-8 + 0x1p-40};
  EXPECT_EQ((CastValues<double, uint16_t>(in, DType::kFloat64,
                                          DType::kFloat16)),
            (std::vector<uint16_t>{0x3C01, 0x0001, 0x7BFF, 0x3C04}));
  EXPECT_EQ((CastValues<double, uint16_t>(in, DType::kFloat64,
                                          DType::kBFloat16)),
            (std::vector<uint16_t>{0x3F80, 0x3300, 0x4780, 0x3F81}));
}

// Every pair of float dtypes, on random and boundary inputs, against the
// reference (non-NaN) or NaN-ness and sign (NaN).
TEST(CastElementsTest, AllFloatPairsMatchReference) {
  std::mt19937_64 rng(42);
  for (DType from : kFloats) {
    const std::vector<uint8_t> src = FloatInputs(from, rng, 3000);
    const size_t in_size = DTypeSize(from);
    const size_t count = src.size() / in_size;
    for (DType to : kFloats) {
      SCOPED_TRACE(std::string(DTypeName(from)) + " -> " +
                   std::string(DTypeName(to)));
      const std::vector<uint8_t> dst = Cast(src, from, to);
      const size_t out_size = DTypeSize(to);
      for (size_t i = 0; i < count; ++i) {
        const uint8_t* s = src.data() + i * in_size;
        const uint8_t* d = dst.data() + i * out_size;
        if (IsNaNAt(from, s)) {
          ASSERT_TRUE(IsNaNAt(to, d)) << "element " << i;
          ASSERT_EQ(SignBitAt(to, d), SignBitAt(from, s)) << "element " << i;
          continue;
        }
        const std::vector<uint8_t> expected =
            RefEncodeFloat(to, DecodeFloat(from, s));
        ASSERT_EQ(std::vector<uint8_t>(d, d + out_size), expected)
            << "element " << i << " value " << DecodeFloat(from, s);
      }
    }
  }
}

#ifdef __FLT16_MANT_DIG__
// A second, independent reference for float16: the compiler's _Float16
// conversions (libgcc's soft-float rounding, or F16C).
TEST(CastElementsTest, HalfMatchesCompilerFloat16) {
  std::vector<uint32_t> f32_bits;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 16381) {
    f32_bits.push_back(static_cast<uint32_t>(b));
  }
  // Dense around the float16 range: exponents 100..145, every 509th mantissa.
  for (uint32_t e = 100; e <= 145; ++e) {
    for (uint32_t m = 0; m < (1u << 23); m += 509) {
      f32_bits.push_back(e << 23 | m);
      f32_bits.push_back(0x80000000u | e << 23 | m);
    }
  }
  const std::vector<float> f32 = Values<float>(Bytes(f32_bits));
  const std::vector<uint16_t> got =
      CastValues<float, uint16_t>(f32, DType::kFloat32, DType::kFloat16);
  std::vector<double> f64(f32.begin(), f32.end());
  std::mt19937_64 rng(3);
  for (double& v : f64) v = std::nextafter(v, (rng() & 1) ? 1e300 : -1e300);
  const std::vector<uint16_t> got64 =
      CastValues<double, uint16_t>(f64, DType::kFloat64, DType::kFloat16);
  for (size_t i = 0; i < f32.size(); ++i) {
    if (std::isnan(f32[i])) continue;
    const _Float16 h = static_cast<_Float16>(f32[i]);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(got[i], want) << std::hexfloat << f32[i];
    const _Float16 h64 = static_cast<_Float16>(f64[i]);
    std::memcpy(&want, &h64, 2);
    ASSERT_EQ(got64[i], want) << std::hexfloat << f64[i];
  }
}
#endif

TEST(CastElementsTest, UnalignedBuffers) {
  std::mt19937_64 rng(11);
  const std::vector<std::pair<DType, DType>> pairs = {
      {DType::kFloat32, DType::kBFloat16}, {DType::kBFloat16, DType::kFloat32},
      {DType::kFloat32, DType::kFloat64},  {DType::kFloat64, DType::kFloat16},
      {DType::kFloat16, DType::kFloat64},  {DType::kInt64, DType::kInt16},
      {DType::kUInt8, DType::kInt64},      {DType::kFloat32, DType::kFloat32}};
  for (const auto& [from, to] : pairs) {
    SCOPED_TRACE(std::string(DTypeName(from)) + " -> " +
                 std::string(DTypeName(to)));
    const uint64_t count = 37;
    std::vector<uint8_t> aligned(count * DTypeSize(from));
    for (auto& b : aligned) b = rng();
    const std::vector<uint8_t> want = Cast(aligned, from, to);
    for (int shift = 1; shift < 8; shift += 2) {
      std::vector<uint8_t> src(aligned.size() + 8), dst(want.size() + 8);
      std::memcpy(src.data() + shift, aligned.data(), aligned.size());
      CastElements(src.data() + shift, from, dst.data() + 8 - shift, to,
                   count);
      EXPECT_EQ(std::memcmp(dst.data() + 8 - shift, want.data(), want.size()),
                0);
    }
  }
}

TEST(CastElementsTest, ZeroCountTouchesNothing) {
  uint8_t dst[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  CastElements(nullptr, DType::kFloat32, dst, DType::kFloat32, 0);
  CastElements(nullptr, DType::kFloat32, dst, DType::kBFloat16, 0);
  EXPECT_EQ(dst[0], 1);
  EXPECT_EQ(dst[7], 8);
}

// ---------------------------------------------------------------------------
// CopyRegion

// Element-by-element reference.
void NaiveCopyRegion(const uint8_t* src, const Box& src_box, DType src_dtype,
                     uint8_t* dst, const Box& dst_box, DType dst_dtype,
                     const Box& region) {
  const uint64_t n = region.NumElements();
  const size_t rank = region.rank();
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t rest = i, src_flat = 0, dst_flat = 0;
    uint64_t src_stride = 1, dst_stride = 1;
    for (size_t d = rank; d-- > 0;) {
      const uint64_t coord = region.origin[d] + rest % region.shape[d];
      rest /= region.shape[d];
      src_flat += (coord - src_box.origin[d]) * src_stride;
      dst_flat += (coord - dst_box.origin[d]) * dst_stride;
      src_stride *= src_box.shape[d];
      dst_stride *= dst_box.shape[d];
    }
    CastElements(src + src_flat * DTypeSize(src_dtype), src_dtype,
                 dst + dst_flat * DTypeSize(dst_dtype), dst_dtype, 1);
  }
}

// A box containing `region`, tight along each dimension half the time (so
// trailing dimensions often collapse into one run).
Box EnclosingBox(const Box& region, std::mt19937_64& rng) {
  Box box = region;
  for (size_t d = 0; d < region.rank(); ++d) {
    if (rng() % 2) continue;
    const uint64_t before = rng() % (region.origin[d] + 1);
    box.origin[d] -= before;
    box.shape[d] += before + rng() % 4;
  }
  return box;
}

void CheckAgainstNaive(const Box& src_box, DType src_dtype, const Box& dst_box,
                       DType dst_dtype, const Box& region,
                       std::mt19937_64& rng) {
  SCOPED_TRACE("src " + src_box.ToString() + " dst " + dst_box.ToString() +
               " region " + region.ToString());
  std::vector<uint8_t> src(src_box.NumElements() * DTypeSize(src_dtype));
  for (auto& b : src) b = rng() % 64;  // small bytes: no NaNs in floats
  std::vector<uint8_t> dst(dst_box.NumElements() * DTypeSize(dst_dtype));
  for (auto& b : dst) b = rng() % 64;
  std::vector<uint8_t> want = dst;
  NaiveCopyRegion(src.data(), src_box, src_dtype, want.data(), dst_box,
                  dst_dtype, region);
  CopyRegion(src.data(), src_box, src_dtype, dst.data(), dst_box, dst_dtype,
             region);
  ASSERT_EQ(dst, want);
}

TEST(CopyRegionTest, RandomBoxesMatchNaive) {
  std::mt19937_64 rng(2024);
  const std::vector<std::pair<DType, DType>> dtypes = {
      {DType::kUInt8, DType::kUInt8},
      {DType::kBFloat16, DType::kBFloat16},
      {DType::kFloat32, DType::kFloat32},
      {DType::kInt64, DType::kInt64},
      {DType::kFloat32, DType::kBFloat16},
      {DType::kBFloat16, DType::kFloat32},
      {DType::kFloat16, DType::kFloat64},
      {DType::kInt32, DType::kInt8},
      {DType::kUInt16, DType::kInt64}};
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t rank = 1 + rng() % 4;
    Box region;
    for (size_t d = 0; d < rank; ++d) {
      region.origin.push_back(rng() % 10);
      region.shape.push_back(1 + rng() % 5);
    }
    const auto& [src_dtype, dst_dtype] = dtypes[iter % dtypes.size()];
    CheckAgainstNaive(EnclosingBox(region, rng), src_dtype,
                      EnclosingBox(region, rng), dst_dtype, region, rng);
    if (HasFatalFailure()) return;
  }
}

TEST(CopyRegionTest, FullyContiguous) {
  std::mt19937_64 rng(5);
  const Box box{{2, 3, 4}, {3, 4, 5}};
  CheckAgainstNaive(box, DType::kFloat32, box, DType::kFloat32, box, rng);
  CheckAgainstNaive(box, DType::kFloat32, box, DType::kFloat64, box, rng);
  // Row block of a larger source into an exact destination.
  const Box rows{{3, 3, 4}, {1, 4, 5}};
  CheckAgainstNaive(box, DType::kInt16, rows, DType::kInt16, rows, rng);
}

TEST(CopyRegionTest, RankZero) {
  const Box scalar;
  const float src = 2.5f;
  double dst = 0;
  CopyRegion(reinterpret_cast<const uint8_t*>(&src), scalar, DType::kFloat32,
             reinterpret_cast<uint8_t*>(&dst), scalar, DType::kFloat64,
             scalar);
  EXPECT_EQ(dst, 2.5);
  int32_t isrc = -7, idst = 0;
  CopyRegion(reinterpret_cast<const uint8_t*>(&isrc), scalar, DType::kInt32,
             reinterpret_cast<uint8_t*>(&idst), scalar, DType::kInt32, scalar);
  EXPECT_EQ(idst, -7);
}

TEST(CopyRegionTest, ZeroSizeRegionTouchesNothing) {
  const Box box{{0, 0}, {2, 3}};
  const Box empty{{1, 0}, {0, 3}};
  std::vector<uint8_t> src(6, 1), dst(6, 9);
  CopyRegion(src.data(), box, DType::kUInt8, dst.data(), box, DType::kUInt8,
             empty);
  CopyRegion(src.data(), box, DType::kUInt8, dst.data(), box, DType::kInt64,
             empty);
  EXPECT_EQ(dst, std::vector<uint8_t>(6, 9));
}

TEST(CopyRegionTest, CastsInsideRegion) {
  // A 2x3 float32 source; copy its right column block into a 4x4 bfloat16
  // destination at rows 1-2, columns 2-3.
  const Box src_box{{1, 1}, {2, 3}};
  const std::vector<float> src = {1.0f, 2.0f,  3.0f,
                                  4.0f, 5.0f, 1.0f + 0x1p-8f};
  const Box dst_box{{0, 0}, {4, 4}};
  std::vector<uint16_t> dst(16, 0xFFFF);
  const Box region{{1, 2}, {2, 2}};
  CopyRegion(reinterpret_cast<const uint8_t*>(src.data()), src_box,
             DType::kFloat32, reinterpret_cast<uint8_t*>(dst.data()), dst_box,
             DType::kBFloat16, region);
  std::vector<uint16_t> want(16, 0xFFFF);
  want[1 * 4 + 2] = 0x4000;  // 2
  want[1 * 4 + 3] = 0x4040;  // 3
  want[2 * 4 + 2] = 0x40A0;  // 5
  want[2 * 4 + 3] = 0x3F80;  // 1 + 2^-8 ties to even: 1
  EXPECT_EQ(dst, want);
}

}  // namespace
}  // namespace shardkeep::internal
