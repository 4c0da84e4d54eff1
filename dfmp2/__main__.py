from ._command import main

main()
