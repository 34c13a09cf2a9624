// tutti-perf's check of results: what each rank's input holds, and what a correct result
// must hold there, in every NCCL type.
#pragma once

#include <cstddef>

namespace tutti::perf {

// What each rank's input holds (element i of rank r), so that a result made without the other
// ranks, from the wrong rank or at the wrong place differs from the expected one:
//  - reductions: (r + i) % 3, in {0, 1, 2}: every sum and extreme of a few ranks is exact in
//    every type (products: inputValue);
//  - collectives that only move data: (31 r + i) modulo the count of integers the type holds
//    exactly from 0 on (9 for fp8 e5m2 ... 2^20 + 1), to which 31 is prime: distinct on every
//    rank for a given element, up to that many ranks.
struct InputValues {
  bool moved = false;
  size_t modulus = 3;
};
extern InputValues gInputs;  // set once per collective, before any rank runs

// How many integers from 0 on the type holds exactly.
size_t exactIntegers(int dtype);
// Element i of rank r's input (op: the reduction's, where it matters; -1 otherwise).
double inputValue(int rank, size_t i, int op = -1);
// Element i of a reduction over nranks ranks' inputs, each offset by rankOffset elements.
double reduced(int op, int dtype, int nranks, size_t i, size_t rankOffset);
// How far a result of the type may be from the expected value.
double tolerance(int dtype, double expect);

}  // namespace tutti::perf
