"""A short training loop for recording a real Nsight Systems export (the nsys reader's fixture).

    nsys profile -t cuda,nvtx -c cudaProfilerApi -o /tmp/r python3 gpu/nsys_small.py
    nsys export --type sqlite -o nsys_resnet18_h200.sqlite /tmp/r.nsys-rep

ResNet-18, batch 64, AMP fp16, channels_last; NVTX range "iteration N" per step; the capture
range (cudaProfilerStart/Stop) covers iterations 3-5 as in the seed article's workflow.
"""

import torch
import torchvision

model = torchvision.models.resnet18().cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(64, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (64,), device="cuda")
for i in range(7):
    if i == 3:
        torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push(f"iteration {i}")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch.cuda.nvtx.range_pop()
    if i == 5:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
print("done")
