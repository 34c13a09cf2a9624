// tutti-perf's check of results: what each rank's input holds, and what a correct result
// must hold there, in every NCCL type.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::perf {

// The inputs of one collective (one type, one op, one count of ranks): element i of rank r is a
// hash of (r, i), so that no two ranks' inputs and no two places of one input follow a pattern a
// misplaced block, a shifted element or a value taken from the wrong rank could still match
// (inputs that repeat every few elements, or ranks whose inputs are alike, let such a result
// pass). Every value is a small integer, bounded so that every correct result is exact in the
// type, whatever order the library combines the ranks in:
//  - sums: |value| <= (exact - 1) / nranks (with more ranks than that, only the first exact - 1
//    ranks hold anything but 0); negative too where the type is signed;
//  - averages: the same, never negative (float averages are rounded, see tolerance);
//  - max, min and collectives that only move data: anything the type holds exactly;
//  - products: +-1, or +-2 on at most as many ranks as the type holds a power of two for; the
//    sign only where the type is signed.
// `exact` is how many integers from 0 on the type holds exactly (exactIntegers).
class Inputs {
 public:
  // op: the reduction (ncclRedOp_t), or -1 for collectives that only move data.
  Inputs(int dtype, int op, int nranks);
  // Element i of rank r's input.
  double at(int rank, size_t i) const;
  // Element i of the reduction of every rank's input, each taken at i + offset.
  double reduced(size_t i, size_t offset = 0) const;
  // How far a result may be from `want`: 0 but for floating-point averages (each input scaled,
  // then summed: a rounding per rank).
  double tolerance(double want) const;

 private:
  int dtype_, op_, nranks_;
  bool signed_;
  int64_t bound_ = 0;  // largest magnitude of a value
  int active_ = 0;     // ranks whose values may be other than 0 (sums) or 2 (products)
};

// How many integers from 0 on the type holds exactly.
size_t exactIntegers(int dtype);

}  // namespace tutti::perf
