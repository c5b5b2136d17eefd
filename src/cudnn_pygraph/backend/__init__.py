"""The cuDNN C++ backend as a peer in the plan list. backend/lowering.py is the ONLY
module that imports the cuDNN frontend's compiled module; backend/adapter.py is the
engine-shaped object the planner treats like any python engine."""
