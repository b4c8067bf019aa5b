"""Apart from the product: platform stand-ins that write rows and blobs and emit events, the workload generator and the demo."""
