"""The planner: how fast a training runs on N GPUs, and which server to get.

    predict          the scaling model from a measured run: speedup and efficiency on hardware you do not have
    plan             a forecast without a run directory: a model, a GPU and a server from the catalogue
    forecast         one step's compute, all-reduce and hidden part on hosts x GPUs; the table over GPU counts
    calibration      the model's inputs read from a run directory
    comms, links     the communication model and the links it moves gradients over
    catalogue_links  the links of a catalogue GPU or server (tftoolkit/catalogue/*.toml)
    validation, intervals, achieved   the planner against published rows, the interval every forecast carries
    memory, modelsize                 does a configuration fit; a model's parameters, FLOPs and memory, counted
    inputlimit       at which GPU count a host's input becomes the limit
    candidates       candidate servers side by side (notebook 07)
    choices          the named choices and defaults the CLI offers (light: no NumPy, no pandas)

All read files and import no TensorFlow, but modelsize (which builds a named model to count it).
"""
