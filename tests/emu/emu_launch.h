// Runs a device kernel of the CPU emulation: kernel (ncclDataType_t, dev::Fn, dev::Proto) on
// `blocks` blocks of `threads` CPU threads, with `work` (a dev::DevWork), to completion.
#pragma once

void emuLaunch(int dtype, int fn, int proto, unsigned blocks, unsigned threads, const void* work);
// The same for a launch of many sends and receives: dev::p2pManyKernel with `work` (a
// dev::DevP2pWork).
void emuLaunchP2pMany(unsigned blocks, unsigned threads, const void* work);
