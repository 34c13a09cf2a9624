// What the correctness matrix knows about a case's values (tests/collectives/matrix.cc), shared
// with the code that runs cases (case_run.cc): each rank's inputs, and what every output element
// must hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/matrix.h"

namespace tutti::test::oracle {

constexpr uint8_t kPoison = 0xA5;  // every output byte before the call

size_t sizeOf(int dtype);
bool isReduction(TestColl c);
bool hasRoot(TestColl c);
bool hasInPlace(TestColl c);

// Rank r's input element j for a case.
double inputValue(const Case& c, int r, size_t j);
// The PreMulSum scalar of a case whose op is kPreMulHost or kPreMulDevice.
double preScalar(const Case& c);

// An output element's expected value: the type's bit pattern (integers) or a value and its
// tolerance (floats).
struct Expect {
  bool exactBits;
  uint64_t bits;
  double value;
  double tol;
};
// The reduction over nranks ranks of element j.
Expect reduceOracle(const Case& c, int nranks, size_t j);
// Rank r's input element j, as it travels (converted to the type).
Expect copied(const Case& c, int r, size_t j);
bool matches(int dtype, const void* got, const Expect& e);
std::string describeMismatch(const Case& c, const char* what, size_t i, const void* got,
                             const Expect& e);

}  // namespace tutti::test::oracle
