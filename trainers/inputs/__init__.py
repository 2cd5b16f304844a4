"""The input layer: option parsing and files, model references and folders, output targets (what a command may
write), checkpoint loading, and each command's resolved options. `UserError` is raised here and in the drivers."""
