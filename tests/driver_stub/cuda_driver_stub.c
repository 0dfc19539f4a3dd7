/* cuda_driver_stub.c — a stand-in for the NVIDIA driver's libcuda.so.1 that
 * shows no device, for cli_test.sh: fsoff on a machine with the driver but
 * no GPU it may use must train on the CPU, say why, and not load its CUDA
 * module. Only the three calls fsoff's loader makes before the module. */
#define STUB_NO_DEVICE 100 /* CUDA_ERROR_NO_DEVICE */

int cuInit(unsigned flags);
int cuDeviceGetCount(int *count);
int cuGetErrorString(int error, const char **str);

int cuInit(unsigned flags)
{
    (void)flags;
    return STUB_NO_DEVICE;
}

int cuDeviceGetCount(int *count)
{
    *count = 0;
    return STUB_NO_DEVICE;
}

int cuGetErrorString(int error, const char **str)
{
    *str = error == STUB_NO_DEVICE ? "no CUDA-capable device is detected" : "unknown error";
    return 0;
}
